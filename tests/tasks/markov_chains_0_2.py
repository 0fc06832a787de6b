"""``notebooks/markov_chains.py`` as plateauscope 0.2's manual had an author write it (imports from the
internal modules, which moved in 0.3), kept unchanged: ``tests/test_deprecation.py`` trains it.

In-context Markov chains (Edelman et al. 2024), a task in one file: each sequence has its own random chain, read
from the context as a marginal (unigram) or a conditional (bigram: the states after the current one's earlier uses)."""

from __future__ import annotations

from dataclasses import dataclass
from math import log

import torch
from torch import Tensor

from plateauscope.training.config import JsonConfig, ModelConfig, TrainConfig
from plateauscope.tasks.base import AttentionRule, ProgressMeasure, PromptPairs, Task


@dataclass(frozen=True)
class MarkovConfig(JsonConfig):
    n_states: int = 4  # k
    length: int = 48  # states per sequence, after <BOS>
    alpha: float = 0.25  # Dirichlet concentration of each transition row
    n_sequences: int = 8192
    seed: int = 0


class MarkovChains(Task):
    Config = MarkovConfig
    capabilities = frozenset({"cue", "pairs", "plateau_reference"})
    default_model = ModelConfig(n_layers=2, d_model=64, n_heads=2, d_head=32, attn_only=True)
    default_train = TrainConfig(batch_size=64, max_steps=1200, eval_every=10, ckpt_every=10, eval_groups=512,
                                stop_after_tau=1.5)

    def __init__(self, cfg: MarkovConfig, tokens: Tensor):
        self.cfg, self.tokens, self.vocab = cfg, tokens, ["<BOS>", *(f"s{i}" for i in range(cfg.n_states))]
        logp = self.predictors(tokens[:1024])  # the predictors' losses on the data
        self.unigram_loss, self.bigram_loss = -logp["unigram"].mean().item(), -logp["bigram"].mean().item()

    @classmethod
    def generate(cls, cfg: MarkovConfig) -> MarkovChains:
        gen, k, n = torch.Generator().manual_seed(cfg.seed), cfg.n_states, cfg.n_sequences
        gamma = torch._standard_gamma(torch.full((n, k, k), cfg.alpha), generator=gen)
        rows = gamma / gamma.sum(-1, keepdim=True)  # one transition matrix per sequence
        states = torch.zeros(n, cfg.length, dtype=torch.long)
        states[:, 0] = torch.randint(0, k, (n,), generator=gen)
        for t in range(1, cfg.length):
            states[:, t] = torch.multinomial(rows[torch.arange(n), states[:, t - 1]], 1, generator=gen)[:, 0]
        return cls(cfg, torch.cat([torch.zeros(n, 1, dtype=torch.long), states + 1], dim=1))

    @property
    def loss_positions(self) -> list[int]:
        return list(range(1, self.input_len))  # every state predicts the next

    @property
    def progress(self) -> ProgressMeasure:
        return ProgressMeasure("excess_loss", self.unigram_loss - self.bigram_loss, "unigram_excess", True, None,
                               "loss above the bigram predictor", "the unigram's excess")

    def predictors(self, seqs: Tensor) -> dict[str, Tensor]:
        """Log-probability of each next state under the add-one in-context unigram and bigram predictors."""
        k, pos = self.cfg.n_states, torch.tensor(self.loss_positions)
        onehot = torch.nn.functional.one_hot(seqs[:, 1:] - 1, k).float()  # [N, length, k]
        uni = onehot.cumsum(1)[:, pos - 1] + 1  # counts of the states so far
        pairs = (onehot[:, :-1, :, None] * onehot[:, 1:, None, :]).cumsum(1)  # transitions seen, [N, length-1, k, k]
        seen = torch.cat([torch.zeros_like(pairs[:, :1]), pairs], 1)[:, pos - 1]
        bi = seen[torch.arange(len(seqs))[:, None], torch.arange(len(pos)), seqs[:, pos] - 1] + 1  # from the current
        return {name: (c / c.sum(-1, keepdim=True)).log().gather(-1, seqs[:, pos + 1, None] - 1)[..., 0]
                for name, c in (("unigram", uni), ("bigram", bi))}

    def build_evalset(self, n_eval: int, n_tracked: int, seed: int) -> Tensor:
        return self.tokens[self.sample_examples(n_eval, seed)]

    @torch.inference_mode()
    def evaluate(self, model, evalset: Tensor, batch_size: int = 512) -> dict:
        pos = torch.tensor(self.loss_positions)
        logp = model(evalset[:, : self.input_len])[:, pos].float().log_softmax(-1)
        loss = -logp.gather(-1, evalset[:, pos + 1, None]).mean().item()
        ref = {name: x.mean().item() for name, x in self.predictors(evalset).items()}  # mean log-probabilities
        return {"loss": loss, "accuracy": (logp.argmax(-1) == evalset[:, pos + 1]).float().mean().item(),
                "excess_loss": loss + ref["bigram"], "unigram_gap": loss + ref["unigram"]}

    def plateau_reference(self, evalset=None) -> dict:  # know-nothing: uniform over k states; marginal: unigram
        return {"metric": "unigram_gap", "marginal": 0.0, "unigram_gap": log(self.cfg.n_states) - self.unigram_loss}

    def cue_positions(self, tokens: Tensor, query: int) -> Tensor:  # the states after earlier occurrences (-1: pad)
        keys, after = torch.full((len(tokens), self.input_len), -1), torch.arange(2, query + 1)
        keys[:, 2: query + 1] = torch.where(tokens[:, 1:query] == tokens[:, query, None], after, -1)
        return keys

    def attention_rules(self) -> dict[str, AttentionRule]:  # scored once a quarter of the chain is seen
        return {"cue": AttentionRule(self.loss_positions[self.cfg.length // 4:], self.cue_positions)}

    def prompt_pairs(self, n: int = 256, seed: int = 0) -> PromptPairs:  # corrupted: the latest successor changed
        p, examples = self.input_len - 1, self.sample_examples(2 * n, seed)
        latest = self.cue_positions(self.tokens[examples], p).max(1, keepdim=True).values  # the latest successor
        keep = ((latest > 0) & (latest < p))[:, 0]
        examples, cue = examples[keep][:n], latest[keep][:n]
        clean = self.tokens[examples, : p + 1]
        answer, other = clean.gather(1, cue)[:, 0], clean.gather(1, cue)[:, 0] % self.cfg.n_states + 1  # another state
        return PromptPairs(clean, clean.scatter(1, cue, other[:, None]), answer, other, examples, p)
