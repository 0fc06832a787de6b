"""The task protocol: everything training and the analyses ask of a task, and nothing else.

A task is a data set of fixed-length token sequences and the questions asked of it:

* the vocabulary and the sequence length (with a ``ModelConfig``, the model's config);
* the data set ``tokens`` (training batches are drawn from it) and an evaluation set;
* the loss: which positions count (``loss_positions``; the logits at ``p`` predict token ``p + 1``),
  in one function, :meth:`Task.loss`, that training, ensembles, the Hessian, the LLC and the
  benches all call;
* the progress measure that defines tau and the plateau (:class:`ProgressMeasure`);
* clean / corrupted prompt pairs with the metric's answer tokens (:class:`PromptPairs`);
* named positions: the prediction position ``pred_pos`` the metric reads, and for each sequence
  and query position the positions of the *cue* the routing must read (:meth:`Task.cue_positions`),
  plus any other named attention patterns worth scoring (:meth:`Task.attention_rules`);
* capabilities (:data:`CAPABILITIES`), so an analysis asks one question, :meth:`Task.require`,
  instead of testing a task's options.

A task of your own is one Python file with a subclass of :class:`Task`; ``python -m
plateauscope.training.train --task my_task.py:MyTask`` trains it (:mod:`plateauscope.tasks.loading`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from plateauscope.errors import ConfigError
from plateauscope.model.config import ModelConfig, hooked_config_dict

CAPABILITIES: dict[str, str] = {
    "cue": "a cue the routing must read (attention to the cue, patching by position, the circuit's read positions)",
    "pairs": "clean / corrupted prompt pairs (activation and attribution patching, the circuit's head shares)",
    "candidates": "K x K candidate scores per group (head ablation scores them; a task without them is scored "
                  "by its own evaluate)",
    "plateau_reference": "exact know-nothing references (the plateau verdict: marginal, shelf or mixed)",
    "references": "a ladder of reference predictors (the KL to each at every evaluation, and the stages)",
}
"""What a task can offer beyond the loss and its progress measure, and what needs it."""


class TaskError(ConfigError):
    """A task that cannot serve a request, or a task file that breaks the protocol (one line)."""


@dataclass(frozen=True)
class ProgressMeasure:
    """The logged quantity whose drop (or rise) defines tau and the plateau."""

    key: str
    """The ``metrics.jsonl`` field, e.g. ``candidate_loss``."""
    height: float
    """Its value on the plateau (a loss) or the level to cross (an accuracy), e.g. log K."""
    height_name: str = "log_k"
    """What ``height`` is called in ``summary.json`` and in captions (``log_k``: log K)."""
    falls: bool = True
    """True: a loss, tau is the first step below ``threshold * height``. False: an accuracy, tau is
    the first step above ``threshold`` (its height is then unused)."""
    cue_effect_key: str | None = None
    """A logged field that is ~0 while the cue is ignored and large once it is used (``delta_z``);
    the plateau requires it below ``0.1 height``. None: no such field."""
    label: str = ""
    """A name for figures and captions (default: ``key`` with spaces)."""
    height_label: str = "the plateau height"
    """How captions write the height (the selector task: log K)."""
    cue_label: str = "cue effect"
    """How captions write the cue effect (the selector task: Δz)."""

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.key.replace("_", " "))

    def crossed(self, record: dict, threshold: float = 0.5) -> bool:
        """Whether one ``metrics.jsonl`` record has made the drop (below / above the threshold)."""
        value = record.get(self.key)
        if value is None:
            return False
        if self.falls:
            return self.height > 0 and value < threshold * self.height
        return value > threshold

    def on_plateau(self, record: dict, rel_tol: float = 0.1, cue_tol: float = 0.1) -> bool:
        """Whether a record sits on the plateau: within ``rel_tol`` of the height, the cue unused."""
        value = record.get(self.key)
        if not self.falls or value is None:
            return False
        if self.cue_effect_key is not None and record.get(self.cue_effect_key) is None:
            return False
        cue_unused = self.cue_effect_key is None or record[self.cue_effect_key] < cue_tol * self.height
        return abs(value - self.height) <= rel_tol * self.height and cue_unused


MEASURE_SHAPES = ("model", "layer", "head")
"""What one value of a :class:`Measure` describes: the whole model, each layer, or each head."""


@dataclass(frozen=True)
class Measure:
    """A named quantity of the model, computed at every analysed checkpoint like any other signal.

    ``compute(model, task, evalset)`` returns a number (``per="model"``), or one number per layer
    (``[n_layers]``) or per head (``[n_layers, n_heads]``). It runs under ``torch.no_grad()`` on the
    run's evaluation set; it must not change the model. A task declares its measures in
    :meth:`Task.measures`; the built-in ones live in :mod:`plateauscope.model.measures`.
    """

    name: str
    """The signal's name in the cache, the report and ``moved_first`` (letters, digits and ``_``)."""
    compute: Callable[[nn.Module, Any, Any], float | Tensor]
    """``(model, task, evalset) -> value``."""
    per: str = "model"
    """One of :data:`MEASURE_SHAPES`."""
    description: str = ""
    """One line for the report and ``--help`` listings."""

    def __post_init__(self) -> None:
        if not self.name.replace("_", "").isalnum():
            raise TaskError(f"measure name {self.name!r}: use letters, digits and '_'")
        if self.per not in MEASURE_SHAPES:
            raise TaskError(f"measure {self.name!r}: per must be one of {', '.join(MEASURE_SHAPES)}, not {self.per!r}")


@dataclass(frozen=True)
class AttentionRule:
    """A named attention pattern: the query positions it is scored at, and where each should look."""

    queries: list[int]
    """The query positions (e.g. the loss positions)."""
    keys: Callable[[Tensor, int], Tensor]
    """``keys(tokens, query)``: ``[N, C]`` key positions per sequence (like ``Task.cue_positions``)."""


@dataclass(frozen=True)
class ReferencePredictor:
    """One rung of a task's ladder of reference predictors (Edelman et al. 2024): a fixed rule for
    the next token at every loss position, e.g. uniform, the marginal, the full conditional.

    The training loop logs ``kl_<name>``, the model's KL divergence *from* the reference,
    ``KL(reference || model)``, averaged over the reference sequences and the loss positions
    (``plateauscope.runs.references``). It is finite where the reference is one-hot (then it is the
    model's cross-entropy on that token) and 0 for a model that is exactly the reference.
    """

    name: str
    """A short identifier: ``metrics.jsonl`` logs ``kl_<name>`` (letters, digits and ``_``)."""
    label: str
    """How figures and captions write it, e.g. ``p(A | B)``."""
    predict: Callable[[Tensor], Tensor]
    """``predict(tokens)``: ``tokens`` ``[N, seq]`` full sequences -> ``[N, n_loss, vocab]`` probabilities
    of the token after each loss position (rows sum to 1; zeros allowed). It may read the whole
    sequence (a full conditional knows the answer); a rule of the context reads only ``tokens[:, :p + 1]``."""
    verdict: str | None = None
    """The kind of the threshold plateau verdict this rung is (``shelf``, ``global marginal``,
    ``marginal``), so that the ladder's reading of the plateau can be checked against it; None: none."""


@dataclass
class PromptPairs:
    """Clean and corrupted prompts with their answer tokens: the inputs of every patching analysis.

    Metric (sign: positive = the model prefers the clean answer): the logit difference
    ``logit[clean_answer] - logit[corrupt_answer]`` at ``pred_pos``, averaged over pairs.
    """

    clean: Int[Tensor, "N prompt_len"]
    corrupt: Int[Tensor, "N prompt_len"]
    clean_answer: Int[Tensor, " N"]
    """The token the clean prompt should predict at ``pred_pos``."""
    corrupt_answer: Int[Tensor, " N"]
    """The token the corrupted prompt should predict there."""
    examples: Int[Tensor, " N"]
    """Index of each clean example in the task's data set ``tokens``, which holds the held-out split too
    (:meth:`Task.heldout_indices`); :meth:`Task.pair_sequences` reads them."""
    pred_pos: int
    """The position whose logits are measured (the last position of the prompt)."""


class Task(ABC):
    """A task: its data set, its loss and the named positions the analyses read.

    A subclass sets ``name`` and ``Config`` (a frozen dataclass with ``to_dict`` / ``from_dict``
    and ``validate``, e.g. built on ``plateauscope.JsonConfig``), and implements the abstract
    members. ``generate(cfg)`` must be deterministic in the config. ``Config.validate()`` raises a
    one-line ``plateauscope.errors.ConfigError`` for an impossible config (``JsonConfig``'s accepts
    everything); ``plateauscope train --set KEY=VALUE`` sets a ``Config`` field.

    Optional class attributes: ``default_model`` (a ``ModelConfig``) and ``default_train`` (a
    ``TrainConfig``), what ``plateauscope train --task`` uses without a preset (default: their
    defaults). The task is checked when it is loaded (``plateauscope.tasks.loading.build_task``).
    """

    name: ClassVar[str]
    """The name runs record (``config.json``'s ``task_name``) for a built-in task."""
    Config: ClassVar[type]
    """The task's configuration dataclass (``RunConfig.task``)."""
    capabilities: ClassVar[frozenset[str]] = frozenset()
    """The subset of :data:`CAPABILITIES` this task offers."""

    cfg: Any
    vocab: list[str]
    """Token strings in id order."""
    tokens: Int[Tensor, "D seq"]
    """The data set: every example as a full sequence (training minibatches are drawn from it)."""

    # ---- the data -----------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def generate(cls, cfg: Any) -> Task:
        """The task's data set for a configuration (deterministic in it)."""

    @classmethod
    def from_records(cls, cfg: Any, records: list[dict]) -> Task:
        """Rebuild from ``dataset.jsonl`` (default: generate again; the records are a readable copy)."""
        return cls.generate(cfg)

    def records(self) -> list[dict]:
        """One dict per example for ``dataset.jsonl`` (default: the tokens as strings)."""
        return [{"tokens": self.decode(row)} for row in self.tokens]

    @property
    def seq_len(self) -> int:
        """Tokens in a full sequence (the model's context is one shorter)."""
        return int(self.tokens.shape[1])

    @property
    def input_len(self) -> int:
        """Tokens fed to the model: the sequence without its last token."""
        return self.seq_len - 1

    def layout_record(self) -> dict:
        """The positions of the task, as ``config.json`` stores them (plain JSON types)."""
        return {"seq_len": self.seq_len, "input_len": self.input_len, "loss_positions": self.loss_positions,
                "pred_pos": self.pred_pos}

    def hooked_config(self, model: ModelConfig) -> dict[str, Any]:
        """The HookedTransformerConfig kwargs of a model of this architecture on this task's vocabulary and
        context (what ``config.json`` stores as ``hooked_transformer_config``)."""
        return hooked_config_dict(model, len(self.vocab), self.seq_len)

    def decode(self, tokens: Int[Tensor, " seq"]) -> list[str]:
        """Token ids back to text."""
        return [self.vocab[t] for t in tokens.tolist()]

    # ---- the loss and the progress measure ----------------------------------------------

    @property
    @abstractmethod
    def loss_positions(self) -> list[int]:
        """Positions whose logits the loss counts (each predicts the next token)."""

    def loss(self, logits: Float[Tensor, "N in_len vocab"], tokens: Int[Tensor, "N seq"]) -> Float[Tensor, ""]:
        """The training objective: mean cross-entropy of the tokens after ``loss_positions``. A task that
        overrides it cannot train with ``--forward trimmed``, which computes only :meth:`loss_at_positions`."""
        return self.loss_at_positions(logits[:, self.loss_positions], tokens)

    def loss_at_positions(self, logits: Float[Tensor, "N n_loss vocab"], tokens: Int[Tensor, "N seq"]
                          ) -> Float[Tensor, ""]:
        """:meth:`loss` from the logits at ``loss_positions`` alone (what the ``trimmed`` forward computes)."""
        pos = torch.tensor(self.loss_positions, device=logits.device)
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, pos + 1].flatten())

    @property
    @abstractmethod
    def progress(self) -> ProgressMeasure:
        """The logged measure that defines tau and the plateau."""

    @abstractmethod
    def build_evalset(self, n_eval: int, n_tracked: int, seed: int) -> Any:
        """The fixed, seeded examples every evaluation of a run looks at."""

    def untracked(self, evalset: Any) -> Any | None:
        """``evalset`` without its tracked examples, for the evaluations between two ``tracked_every``
        steps (``TrainConfig.tracked_every``); None: the task logs nothing less often."""
        return None

    @abstractmethod
    def evaluate(self, model: nn.Module, evalset: Any, batch_size: int = 512) -> dict:
        """Every logged metric of ``model`` on ``evalset`` (plain floats and lists), including
        ``loss``, ``accuracy`` and the progress measure's fields."""

    def evaluate_without_loss(self, model: nn.Module, evalset: Any) -> dict:
        """:meth:`evaluate` less its training loss (``loss``): what an ablation reads (the progress measure and
        its cue effect) and what an imported run's probe records (another trainer's model has no training loss
        here). Default: the whole :meth:`evaluate`, its ``loss`` dropped; a task whose training loss takes a
        forward of its own skips it here."""
        return {k: v for k, v in self.evaluate(model, evalset).items() if k != "loss"}

    # ---- the held-out split (optional) ---------------------------------------------------

    def train_indices(self) -> Int[Tensor, " D_train"] | None:
        """The rows of ``tokens`` that training samples (None: every row). A task with a held-out
        split returns its training rows here and the others from :meth:`heldout_indices`."""
        return None

    def heldout_indices(self) -> Int[Tensor, " D_heldout"] | None:
        """The rows of ``tokens`` training never sees (None: no held-out split). Every evaluation
        logs :meth:`evaluate_heldout`'s metrics on them."""
        return None

    def evaluate_heldout(self, model: nn.Module, batch_size: int = 512) -> dict[str, float]:
        """``heldout_loss`` (:meth:`loss`, averaged over the held-out rows) and ``heldout_accuracy``
        (argmax right at every loss position) of ``model`` on :meth:`heldout_indices` ({} without a split)."""
        rows = self.heldout_indices()
        if rows is None or len(rows) == 0:
            return {}
        device = next(model.parameters()).device
        loss_sum, right = 0.0, 0
        with torch.no_grad():
            for chunk in self.tokens[rows].split(batch_size):
                chunk = chunk.to(device)
                logits = model(chunk[:, : self.input_len])
                loss_sum += float(self.loss(logits, chunk)) * len(chunk)
                pos = torch.tensor(self.loss_positions, device=device)
                right += int((logits[:, pos].argmax(-1) == chunk[:, pos + 1]).all(-1).sum())
        return {"heldout_loss": loss_sum / len(rows), "heldout_accuracy": right / len(rows)}

    def plateau_reference(self, evalset: Any = None) -> dict | None:
        """The exact know-nothing references of the plateau verdict (capability ``plateau_reference``),
        over the examples of ``evalset`` (the run's evaluation set, whose metric the verdict reads;
        None: the whole data set), or None for no verdict. A dict: ``metric`` (the logged field the verdict
        reads, default
        ``set_loss``), ``marginal`` (its value once the marginal is learned, default 0), the metric's
        own name -> its value for a model that knows nothing, and optionally ``global_marginal``
        (``{metric: value}`` for a model that knows the data set's global marginal)."""
        return None

    def measures(self) -> tuple[Measure, ...]:
        """The task's own named measures (default: none); the built-in ones are added by the analysis."""
        return ()

    def reference_predictors(self) -> list[ReferencePredictor]:
        """The ladder of reference predictors (capability ``references``), from the one that knows
        least to the full conditional; the stage of a step is the rung the model is closest to."""
        return []

    def reference_sequences(self, evalset: Any) -> Int[Tensor, "E seq"]:
        """The sequences on which the KL to each reference is measured (default: :meth:`eval_sequences`)."""
        return self.eval_sequences(evalset)

    def summary_fields(self) -> dict:
        """Task facts added to ``summary.json``."""
        return {}

    def tokens_per_example(self) -> int:
        """Predicted tokens per example (for ``tokens_seen``)."""
        return len(self.loss_positions)

    # ---- what the analyses read ---------------------------------------------------------

    @property
    def pred_pos(self) -> int:
        """The position whose logits the patching metric measures (default: the last loss position,
        the one with the most context)."""
        return self.loss_positions[-1]

    def cue_positions(self, tokens: Int[Tensor, "N seq"], query: int) -> Int[Tensor, "N C"]:
        """For each sequence, the positions of the cue that the query at position ``query`` must read
        (``C = 0``: this task has no cue there), a ``torch.long`` tensor. They may differ between
        sequences (induction); a sequence with fewer than ``C`` cue positions pads its row with -1.
        Every other entry must lie in ``[0, query]`` (the positions the query can attend to)."""
        return torch.empty(len(tokens), 0, dtype=torch.long)

    def attention_rules(self) -> dict[str, AttentionRule]:
        """Named attention patterns worth scoring (``plateauscope.analysis.attention``): ``cue``, from the loss
        positions to :meth:`cue_positions`, when the task has a cue, and any others it names."""
        return {"cue": AttentionRule(self.loss_positions, self.cue_positions)} if "cue" in self.capabilities else {}

    def prompt_pairs(self, n: int = 256, seed: int = 0) -> PromptPairs:
        """``n`` seeded clean / corrupted prompt pairs (capability ``pairs``)."""
        raise self.missing("pairs", "prompt pairs")

    def pair_sequences(self, pairs: PromptPairs) -> Int[Tensor, "N L"]:
        """The sequences of the pairs' clean examples, for what an analysis reads at the prediction position
        (attention to the cue, the cue's positions): the rows ``pairs.examples`` of ``tokens`` where each row
        begins with its clean prompt; otherwise the clean prompts themselves (``L = pred_pos + 1``), which hold
        every position the prediction position can read. The second case is a task file written against 0.2,
        which had no held-out split: it kept its held-out examples beside ``tokens`` and indexed its pairs'
        ``examples`` into them."""
        examples, clean = pairs.examples.long().cpu(), pairs.clean.cpu()
        if len(examples) == len(clean) and (not len(examples) or 0 <= int(examples.min()) <= int(examples.max())
                                            < len(self.tokens)):
            rows = self.tokens[examples]
            if rows.shape[1] >= clean.shape[1] and torch.equal(rows[:, : clean.shape[1]], clean):
                return rows
        return clean

    def position_labels(self, n_pos: int) -> list[str]:
        """Readable names of the first ``n_pos`` positions (default: their numbers, BOS first)."""
        labels = [str(i) for i in range(n_pos)]
        if n_pos and self.vocab and self.vocab[0] == "<BOS>":
            labels[0] = "BOS"
        return labels

    def sample_examples(self, n: int, seed: int) -> Int[Tensor, " n"]:
        """``n`` seeded example indices (all of them if the data set has fewer)."""
        gen = torch.Generator().manual_seed(seed)
        return torch.randperm(len(self.tokens), generator=gen)[: min(n, len(self.tokens))]

    def eval_sequences(self, evalset: Any) -> Int[Tensor, "E seq"]:
        """The true sequences of an evaluation set (the means of a mean ablation); default: the
        evaluation set itself, when it is a tensor of sequences."""
        if isinstance(evalset, Tensor) and evalset.dim() == 2:
            return evalset
        raise TaskError(f"the task {self.describe()} must say which sequences its evaluation set holds "
                        "(Task.eval_sequences) for a mean ablation")

    def candidate_tree(self, evalset: Any) -> tuple[Int[Tensor, "G K K seq"], tuple[int, ...]]:
        """Capability ``candidates``: the ``[group, prompt j, candidate k]`` sequences of an evaluation
        set, and the positions where their shared prefixes split (``plateauscope.model.scoring``)."""
        raise self.missing("candidates", "candidate scoring")

    def candidate_metrics(self, scores: Float[Tensor, "G K K"], evalset: Any) -> dict[str, float]:
        """Capability ``candidates``: the logged metrics (at least the progress measure and its cue
        effect) from the summed log-probabilities of :meth:`candidate_tree`."""
        raise self.missing("candidates", "candidate scoring")

    # ---- capabilities -------------------------------------------------------------------

    def require(self, capability: str, what: str) -> None:
        """The one guard: raise a one-line TaskError when this task lacks ``capability``."""
        if capability not in self.capabilities:
            raise self.missing(capability, what)

    def missing(self, capability: str, what: str) -> TaskError:
        """The error for a request this task cannot serve."""
        return TaskError(f"{what} needs {CAPABILITIES.get(capability, capability)}; "
                         f"the task {self.describe()} does not offer it")

    def describe(self) -> str:
        """The task's name and options, for messages."""
        return f"{self.name!r}"
