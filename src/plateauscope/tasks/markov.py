"""In-context Markov chains (Edelman et al. 2024, "The Evolution of Statistical Induction Heads").

Every sequence comes from a Markov chain of its own: a transition matrix over ``k`` states whose rows
are drawn from Dirichlet(alpha, ..., alpha), a uniform start state, then ``T`` states sampled from the
chain. A sequence is ``<BOS>`` and those ``T`` states. As no two sequences share a chain, the only way
to predict the next state well is to estimate the chain *in context*: count, in the prefix, the
transitions out of the current state. The Bayes-optimal predictor does exactly that (the Dirichlet
posterior mean, the in-context *bigram*); a model that only counts the states of the prefix (the
in-context *unigram*) is worse by a margin the data fixes.

The loss counts every position from the first state on (position ``p`` predicts the state at
``p + 1``). Edelman et al. find that a small attention-only transformer learns in stages: uniform,
then the unigram, a plateau there, then the bigram, once a *statistical induction head* forms: a
*previous-token* head in layer 0 writes each state's predecessor into its position, and a head in
layer 1 whose query (the current state) matches those keys reads the states that followed earlier
occurrences of the current state.

Named positions for the analyses (``plateauscope.tasks.base.Task``): the *cue* of a query is every
position right after an earlier occurrence of its state (where the induction head reads the
next-state counts); the ``previous token`` rule is the position before the query; the prediction
position is the last input position. A prompt pair shuffles the states before the prediction position
(every state count kept, the transitions changed) where that changes the bigram's most likely next
state: the answers are the bigram's choice on each prompt, and the unigram prefers neither.

The progress measure is ``excess_loss``, the model's loss minus the bigram reference's loss on the
same evaluation sequences: 0 for the Bayes-optimal predictor. Its height is the unigram reference's
excess loss, the unigram's loss minus the bigram's, averaged over every loss position of the whole
data set (``MarkovTask.unigram_excess``): a model at the unigram stage sits there (on the evaluation
sequences, whose own unigram-bigram gap differs from the data set's by sampling noise). Its cue effect
``delta_cue`` is the loss at the prediction position once the states before it are shuffled (the
current state kept), minus the loss: the shuffle keeps every state count of the prefix and scrambles
its transitions, so it is 0 for the unigram reference and large for the bigram.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from plateauscope.errors import ConfigError
from plateauscope.model.config import JsonConfig, ModelConfig, TrainConfig
from plateauscope.tasks.base import AttentionRule, ProgressMeasure, PromptPairs, ReferencePredictor, Task, TaskError

BOS = "<BOS>"
LOSS_FROM = 1
"""The first loss position: the first state (``<BOS>``, at 0, would predict the uniform start state)."""
_DATA_STREAM, _EVAL_STREAM, _PAIRS_STREAM = 0, 1, 2
"""Tags that keep the random streams of the data set, the evaluation sets and the prompt pairs apart."""


@dataclass(frozen=True)
class MarkovConfig(JsonConfig):
    """Sequences from random Markov chains, one chain per sequence."""

    n_states: int = 3
    """k: states of every chain (the vocabulary is ``<BOS>`` and the k states)."""
    length: int = 64
    """T: states in a sequence; a sequence has ``1 + T`` tokens and the model reads the first T."""
    alpha: float = 1.0
    """Concentration of the Dirichlet(alpha, ..., alpha) each row of a transition matrix is drawn from
    (1: uniform on the simplex; small: nearly deterministic chains); also the pseudo-count of the
    unigram and bigram references."""
    n_sequences: int = 16384
    """Sequences (each with its own chain) in the data set; training minibatches are drawn from them."""
    seed: int = 0
    """Seed of the data set; independent of the training seed."""

    def validate(self) -> None:
        """Fail with one line when the request is impossible."""
        if self.n_states < 2:
            raise ConfigError(f"n_states must be at least 2, got {self.n_states}")
        if self.length < 3:
            raise ConfigError(f"length must be at least 3 (a transition to count before a prediction), "
                              f"got {self.length}")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ConfigError(f"alpha must be a positive finite number, got {self.alpha}")
        if self.n_sequences < 2:
            raise ConfigError(f"n_sequences must be at least 2, got {self.n_sequences}")
        if self.seed < 0:
            raise ConfigError(f"seed must be at least 0, got {self.seed}")


@dataclass
class MarkovEvalSet:
    """The fixed sequences every evaluation of a Markov run reads: fresh chains, none of them trained on."""

    sequences: Int[Tensor, "E seq"]
    """Sequences from chains drawn for the evaluation set alone."""
    shuffled: Int[Tensor, "E seq"]
    """The same sequences with the states before the prediction position randomly permuted (the state
    at the prediction position and after kept): the same state counts, other transitions."""
    bigram_loss: float
    """The bigram reference's loss on ``sequences`` (the excess loss is measured from it)."""


def sample_chains(rng: np.random.Generator, n: int, n_states: int, length: int, alpha: float
                  ) -> tuple[Int[Tensor, "n seq"], Float[Tensor, "n k k"]]:
    """``n`` sequences (``<BOS>`` and ``length`` states, states as token ids ``1 .. k``), each from a chain
    of its own, and the chains' transition matrices (row: the current state)."""
    transitions = rng.dirichlet(np.full(n_states, alpha), size=(n, n_states))
    cdf = np.cumsum(transitions, axis=2)
    uniform = rng.random((n, length - 1))
    states = np.empty((n, length), dtype=np.int64)
    states[:, 0] = rng.integers(n_states, size=n)
    rows = np.arange(n)
    for t in range(1, length):  # inverse-CDF sampling, every chain at once
        drawn = (cdf[rows, states[:, t - 1]] < uniform[:, t - 1, None]).sum(1)
        states[:, t] = np.minimum(drawn, n_states - 1)  # a last cdf rounded below 1
    tokens = np.concatenate([np.zeros((n, 1), dtype=np.int64), states + 1], axis=1)
    return torch.from_numpy(tokens), torch.from_numpy(transitions)


def uniform_probs(tokens: Int[Tensor, "N seq"], positions: list[int], n_states: int
                  ) -> Float[Tensor, "N n_loss vocab"]:
    """Uniform over the ``k`` states at each of ``positions`` (0 on ``<BOS>``)."""
    probs = torch.full((len(tokens), len(positions), n_states + 1), 1.0 / n_states, dtype=torch.float64)
    probs[..., 0] = 0.0
    return probs


def unigram_probs(tokens: Int[Tensor, "N seq"], positions: list[int], n_states: int, alpha: float
                  ) -> Float[Tensor, "N n_loss vocab"]:
    """The in-context unigram at each of ``positions`` ``p >= 1``: ``(c_s + alpha) / (p + k alpha)``,
    ``c_s`` the count of state ``s`` among the states at ``1 .. p`` (0 on ``<BOS>``)."""
    # one_hot over the vocabulary, <BOS> dropped: a running count of each state
    counts = nn.functional.one_hot(tokens, n_states + 1)[..., 1:].double().cumsum(1)[:, positions]
    probs = (counts + alpha) / (counts.sum(-1, keepdim=True) + n_states * alpha)
    return nn.functional.pad(probs, (1, 0))


def bigram_probs(tokens: Int[Tensor, "N seq"], positions: list[int], n_states: int, alpha: float
                 ) -> Float[Tensor, "N n_loss vocab"]:
    """The in-context bigram at each of ``positions`` ``p >= 1``, the Bayes posterior mean of the row of
    the current state ``x_p``: ``(n(x_p -> s) + alpha) / (n(x_p) + k alpha)``, counting the transitions
    ``x_j -> x_{j+1}`` with ``1 <= j < p`` (0 on ``<BOS>``)."""
    n = len(tokens)
    states = tokens - 1  # <BOS> becomes -1 and is never read: transitions start at position 1
    rows = torch.arange(n)
    counts = torch.zeros(n, n_states, n_states, dtype=torch.float64)
    out = torch.empty(n, len(positions), n_states, dtype=torch.float64)
    at = {p: i for i, p in enumerate(positions)}
    for p in range(1, max(positions) + 1):
        if p >= 2:  # the transition into position p, once both ends are states
            counts[rows, states[:, p - 1], states[:, p]] += 1.0
        if p in at:
            row = counts[rows, states[:, p]]
            out[:, at[p]] = (row + alpha) / (row.sum(-1, keepdim=True) + n_states * alpha)
    return nn.functional.pad(out, (1, 0))


def reference_loss(probs: Float[Tensor, "N n_loss vocab"], tokens: Int[Tensor, "N seq"], positions: list[int]
                   ) -> float:
    """The mean cross-entropy of the tokens after ``positions`` under a reference's probabilities."""
    target = tokens[:, torch.tensor(positions) + 1]
    return -probs.gather(-1, target[..., None]).log().mean().item()


def _rng(stream: int, *seeds: int) -> np.random.Generator:
    """A NumPy generator for one stream and its seeds (negative seeds wrap: SeedSequence takes none)."""
    return np.random.default_rng([stream, *(s % 2**64 for s in seeds)])


class MarkovTask(Task):
    """Sequences from random Markov chains: in-context learning of a bigram statistic, whose circuit
    (a previous-token head, then a statistical induction head) and stages (uniform, unigram, bigram)
    are known."""

    name: ClassVar[str] = "markov"
    Config: ClassVar[type] = MarkovConfig
    capabilities: ClassVar[frozenset[str]] = frozenset({"cue", "pairs", "references"})
    # One head a layer, as in Edelman et al.: with four, the induction head forms sooner and the
    # unigram plateau is shorter.
    default_model: ClassVar[ModelConfig] = ModelConfig(n_layers=2, d_model=64, n_heads=1, d_head=64, d_mlp=256,
                                                       attn_only=True)
    default_train: ClassVar[TrainConfig] = TrainConfig(lr=3e-4, batch_size=64, max_steps=2000, eval_every=10,
                                                       ckpt_every=10, eval_groups=512, stop_after_tau=1.5)

    def __init__(self, cfg: MarkovConfig, tokens: Int[Tensor, "D seq"], transitions: Float[Tensor, "D k k"]):
        self.cfg = cfg
        self.vocab = [BOS, *(f"s{i}" for i in range(cfg.n_states))]
        self.tokens = tokens
        self.transitions = transitions
        """Each sequence's transition matrix (row: the current state; float64)."""
        # the height of the progress measure, over every loss position of the data set, in chunks of
        # sequences (a running count per state and position); every sequence has the same positions
        chunks = tokens.split(4096)
        losses = {rung.name: sum(reference_loss(rung.predict(c), c, self.loss_positions) * len(c) for c in chunks)
                  / len(tokens) for rung in self.reference_predictors()}
        self.reference_losses: dict[str, float] = losses
        """Each reference's loss over every loss position of the data set."""
        self.unigram_excess: float = losses["unigram"] - losses["bigram"]
        """The unigram reference's loss minus the bigram's over the data set: the progress measure's height."""

    @classmethod
    def generate(cls, cfg: MarkovConfig) -> MarkovTask:
        """The seeded data set."""
        cfg.validate()
        tokens, transitions = sample_chains(_rng(_DATA_STREAM, cfg.seed), cfg.n_sequences, cfg.n_states,
                                            cfg.length, cfg.alpha)
        return cls(cfg, tokens, transitions)

    def records(self) -> list[dict]:
        """One line per sequence: its states as one string and its transition matrix (4 decimals)."""
        return [{"tokens": " ".join(self.decode(t)), "transitions": np.round(m.numpy(), 4).tolist()}
                for t, m in zip(self.tokens, self.transitions)]

    # ---- the loss and the progress measure ----------------------------------------------

    @property
    def loss_positions(self) -> list[int]:
        """Every position holding a state that has a next state: 1 .. T - 1."""
        return list(range(LOSS_FROM, self.input_len))

    @property
    def progress(self) -> ProgressMeasure:
        """The excess loss over the bigram reference, against the unigram reference's, with ``delta_cue``
        as its cue effect."""
        return ProgressMeasure("excess_loss", self.unigram_excess, "unigram_excess", True, "delta_cue",
                               "excess loss", "the unigram's excess loss", "Δcue")

    def build_evalset(self, n_eval: int, n_tracked: int, seed: int) -> MarkovEvalSet:
        """``n_eval`` sequences from fresh chains (seeded by the data seed and ``seed``), their shuffled
        twins, and the bigram reference's loss on them; ``n_tracked`` is unused (every evaluation reads
        the same set)."""
        rng = _rng(_EVAL_STREAM, self.cfg.seed, seed)
        sequences, _ = sample_chains(rng, n_eval, self.cfg.n_states, self.cfg.length, self.cfg.alpha)
        # permute the states at 1 .. pred_pos - 1 of each sequence; the rest stays in place
        before = self.pred_pos - 1
        order = torch.from_numpy(rng.random((n_eval, before)).argsort(1)) + 1
        shuffled = sequences.clone()
        shuffled[:, 1: self.pred_pos] = sequences.gather(1, order)
        bigram = bigram_probs(sequences, self.loss_positions, self.cfg.n_states, self.cfg.alpha)
        return MarkovEvalSet(sequences, shuffled, reference_loss(bigram, sequences, self.loss_positions))

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, evalset: MarkovEvalSet, batch_size: int = 512) -> dict:
        """``loss`` (every loss position of the evaluation sequences), ``excess_loss`` (the loss minus the
        bigram reference's), ``accuracy`` (the next state the argmax, over the loss positions) and
        ``delta_cue`` (at the prediction position: the loss on the shuffled twins minus the loss)."""
        device = next(model.parameters()).device
        pos = torch.tensor(self.loss_positions)

        def logp(seqs: Tensor, at: Tensor) -> tuple[Tensor, Tensor]:
            logps, hits = [], []
            for chunk in seqs.split(batch_size):
                logits = model(chunk[:, : self.input_len].to(device))[:, at].float().log_softmax(-1).cpu()
                target = chunk[:, at + 1]
                logps.append(logits.gather(-1, target[..., None])[..., 0])
                hits.append(logits.argmax(-1) == target)
            return torch.cat(logps), torch.cat(hits)

        clean_logp, hit = logp(evalset.sequences, pos)
        shuffled_logp, _ = logp(evalset.shuffled, torch.tensor([self.pred_pos]))
        loss = -clean_logp.mean().item()
        return {
            "loss": loss,
            "excess_loss": loss - evalset.bigram_loss,
            "delta_cue": (clean_logp[:, -1] - shuffled_logp[:, 0]).mean().item(),
            "accuracy": hit.float().mean().item(),
        }

    def reference_predictors(self) -> list[ReferencePredictor]:
        """Uniform over the k states; the in-context unigram (the states of the prefix, by count, plus
        alpha); the in-context bigram (the transitions out of the current state in the prefix, by count,
        plus alpha: the Bayes-optimal predictor). Each predicts float64 probabilities."""
        k, alpha, pos = self.cfg.n_states, self.cfg.alpha, self.loss_positions
        return [ReferencePredictor("uniform", "uniform", lambda t: uniform_probs(t, pos, k)),
                ReferencePredictor("unigram", "unigram (in context)", lambda t: unigram_probs(t, pos, k, alpha)),
                ReferencePredictor("bigram", "bigram (in context)", lambda t: bigram_probs(t, pos, k, alpha))]

    def reference_sequences(self, evalset: MarkovEvalSet) -> Int[Tensor, "E seq"]:
        """The evaluation sequences (fresh chains)."""
        return evalset.sequences

    def eval_sequences(self, evalset: MarkovEvalSet) -> Int[Tensor, "E seq"]:
        """The evaluation sequences (fresh chains)."""
        return evalset.sequences

    def summary_fields(self) -> dict:
        """k, T, alpha, and each reference's loss over the data set."""
        return {"n_states": self.cfg.n_states, "length": self.cfg.length, "alpha": self.cfg.alpha,
                **{f"{name}_loss": value for name, value in self.reference_losses.items()}}

    # ---- what the analyses read ---------------------------------------------------------

    @property
    def pred_pos(self) -> int:
        """The last input position (it predicts the last state, with the most context)."""
        return self.input_len - 1

    def prompt_pairs(self, n: int = 256, seed: int = 0) -> PromptPairs:
        """Up to ``n`` seeded pairs from the data set, cut after ``pred_pos``: the corrupted prompt has the
        states before it shuffled, so it keeps every state count and the current state (the unigram
        predicts the same on both) and changes the transitions. The answers are the bigram reference's
        most likely next state on each prompt; only sequences where the two differ (and neither is a
        tie) are kept, so a model that counts transitions prefers the clean answer on the clean prompt."""
        rng = _rng(_PAIRS_STREAM, self.cfg.seed, seed)
        q, k, alpha = self.pred_pos, self.cfg.n_states, self.cfg.alpha
        pool = torch.from_numpy(rng.permutation(len(self.tokens))[: 16 * n])
        clean = self.tokens[pool, : q + 1]
        corrupt = clean.clone()
        corrupt[:, 1: q] = clean.gather(1, torch.from_numpy(rng.random((len(pool), q - 1)).argsort(1)) + 1)

        def choice(prompts: Tensor) -> tuple[Tensor, Tensor]:
            top = bigram_probs(prompts, [q], k, alpha)[:, 0].topk(2)  # [P, 2]: the two likeliest states
            return top.indices[:, 0], top.values[:, 0] - top.values[:, 1] > 1e-9

        clean_answer, clean_clear = choice(clean)
        corrupt_answer, corrupt_clear = choice(corrupt)
        keep = (clean_answer != corrupt_answer) & clean_clear & corrupt_clear
        keep = keep.nonzero()[:, 0][:n]
        if not len(keep):
            raise TaskError(f"the task {self.describe()}: no sequence of its data set changes the bigram's choice "
                            "when shuffled, so it has no prompt pairs (use more or longer sequences)")
        return PromptPairs(clean=clean[keep], corrupt=corrupt[keep], clean_answer=clean_answer[keep],
                           corrupt_answer=corrupt_answer[keep], examples=pool[keep], pred_pos=q)

    def cue_positions(self, tokens: Int[Tensor, "N seq"], query: int) -> Int[Tensor, "N C"]:
        """The positions right after each earlier occurrence of the query's state, in order, padded with
        -1 to ``C = T - 2`` columns at every loss position (the most a query can have: the analyses stack
        the queries' rows); none outside the loss positions."""
        if not self.loss_positions[0] <= query <= self.loss_positions[-1]:
            return torch.empty(len(tokens), 0, dtype=torch.long)
        width = self.loss_positions[-1] - 1
        earlier = tokens[:, 1: query] == tokens[:, query, None]  # [N, query - 1]: occurrences at 1 .. query - 1
        after = torch.arange(2, query + 1)  # the position after each
        # the hits first, in order; the misses sort last and become the padding
        keys = torch.where(earlier, after, query + 1).sort(1).values
        keys = nn.functional.pad(torch.where(keys > query, -1, keys), (0, width - keys.shape[1]), value=-1)
        return keys

    def attention_rules(self) -> dict[str, AttentionRule]:
        """The cue (the statistical induction pattern, from the loss positions) and the previous token
        (from every position after ``<BOS>``: the previous-token head writes the keys the induction head
        matches)."""
        return {**super().attention_rules(), "previous token": AttentionRule(
            list(range(1, self.input_len)), lambda tokens, query: torch.full((len(tokens), 1), query - 1))}

    def describe(self) -> str:
        """``markov (k=3, T=64, alpha=1)``."""
        return f"markov (k={self.cfg.n_states}, T={self.cfg.length}, alpha={self.cfg.alpha:g})"
