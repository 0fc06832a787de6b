"""Probes: tasks that bring prompts instead of a data set, for a series trained elsewhere.

A probe is a :class:`~plateauscope.tasks.base.Task` built for a given model (its vocabulary size and
context length) rather than trained on: its prompts, attention rules, prompt pairs and measures are what
the analyses read on an imported run (:mod:`plateauscope.runs.series`). It is written against token ids
(or the model's own tokenizer); :meth:`Probe.check_vocab` refuses, in one line, a probe whose tokens fall
outside the model's vocabulary.

Built in (:data:`BUILTIN_PROBES`): ``induction`` (:mod:`plateauscope.tasks.induction_probe`). A probe of
one's own is a ``file.py:Class`` (or ``module:Class``) whose class subclasses :class:`Probe` (and, if it
likes, a task, whose abstract members it must then implement). It needs:

* ``for_model(d_vocab, n_ctx, seed, **options)``, a classmethod building it for a model, and ``tokens``
  (``[N, seq]`` token ids) or :meth:`Probe.probe_tokens`;
* at least one measure: :meth:`Probe.detection_patterns` (head scores, on :meth:`Probe.scored_tokens`),
  ``loss_gap(model)`` (a number per checkpoint, whose change point is read), or
  ``prompt_pairs(n, seed)`` returning :class:`~plateauscope.tasks.base.PromptPairs` (exact head patching);
* a ``for_model`` with a ``tokenizer`` argument gets the series' tokenizer (None without one): prompts written
  as text become token ids with :func:`encode_texts`, answers with :func:`token_id`;
* ``probe_name`` (letters, digits, ``_``): the results file ``RUN/analysis/probe_<probe_name>.json``
  (default: the class's name).

A class that lacks these, or whose code fails, is a one-line ProbeError naming the file (and the line).

A head's score on a detection pattern is the field's (:func:`target_scores`): the mean attention from each
position where the pattern has a target to that target, per sequence. Its null (:func:`chance_scores`) is what
uniform causal attention would give there, or, where the probe brings control sequences (:meth:`Probe.controls`:
the same positions with the pattern's content removed), the head's own attention on the controls.
TransformerLens's ``head_detector`` measure (``mul``, :func:`detection_scores`: the attention on the pattern's
entries over all attention, rows with no target included) is kept beside it for comparison.
"""

from __future__ import annotations

import importlib
import inspect
import re
import traceback
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens.utilities import get_act_name

from plateauscope.model.backend import keeps_logits
from plateauscope.tasks.base import PromptPairs, Task, TaskError
from plateauscope.tasks.loading import _check_class, _import_file, _import_module

BUILTIN_PROBES: dict[str, str] = {"induction": "plateauscope.tasks.induction_probe:InductionProbe"}
"""Probe name -> ``module:Class``."""


class ProbeError(TaskError):
    """A probe that does not fit the model (one line)."""


@dataclass
class ProbeSignals:
    """What the probe's pass reads at one checkpoint, per scored sequence (:meth:`Probe.signals`)."""

    scores: dict[str, Float[Tensor, "N n_layers n_heads"]]
    """Detection pattern -> each head's mean attention to the pattern's targets (:func:`target_scores`); NaN in a
    sequence where the pattern has no target."""
    nulls: dict[str, Float[Tensor, "N n_layers n_heads"]]
    """Detection pattern -> the same score under the null: uniform causal attention, or the head's attention on the
    probe's control sequences (:meth:`Probe.controls`)."""
    detector: dict[str, Float[Tensor, "n_layers n_heads"]]
    """Detection pattern -> ``head_detector``'s ``mul`` score (:func:`detection_scores`), for comparison."""
    loss_gap: Float[Tensor, " N"] | None = None
    """The in-context loss gap per sequence (one value where the probe's ``loss_gap`` gives a number), or None."""
    lags: dict[str, Int[Tensor, " N"]] = field(default_factory=dict)
    """Detection pattern -> per sequence, the distance between the two copies its targets come from
    (:meth:`Probe.lags`)."""


class Probe:
    """What a probe adds to a task: it is built for a model, and its token ids are checked against it."""

    probe_name: ClassVar[str] = "probe"

    @classmethod
    def for_model(cls, d_vocab: int, n_ctx: int, seed: int = 0, **options: Any) -> Probe:
        """The probe for a model of ``d_vocab`` token ids and context ``n_ctx``."""
        raise NotImplementedError

    def probe_tokens(self) -> Int[Tensor, "N seq"]:
        """Every sequence the probe runs (default: the task's ``tokens``)."""
        return self.tokens  # type: ignore[attr-defined]

    def scored_tokens(self) -> Int[Tensor, "N seq"]:
        """The sequences the head scores are measured on (default: :meth:`probe_tokens`)."""
        return self.probe_tokens()

    def head_scores(self, model: nn.Module) -> dict[str, Float[Tensor, "n_layers n_heads"]]:
        """Each detection pattern's score per head on :meth:`scored_tokens` (:func:`target_scores`, averaged over
        the sequences); {} without detection patterns."""
        tokens = self.scored_tokens()
        detections = self.detection_patterns(tokens)
        if not detections:
            return {}
        patterns = logits_and_patterns(model, tokens, 0)[1]
        return {name: target_scores(patterns, det).nanmean(0) for name, det in detections.items()}

    def check_vocab(self, d_vocab: int) -> None:
        """A ProbeError naming the largest token id when one falls outside ``[0, d_vocab)``."""
        tokens = self.probe_tokens()
        top, low = int(tokens.max()), int(tokens.min())
        if top >= d_vocab or low < 0:
            raise ProbeError(f"probe {self.probe_name}: token ids {low}..{top} fall outside the model's vocabulary "
                             f"of {d_vocab} tokens")

    def detection_patterns(self, tokens: Int[Tensor, "N seq"]) -> dict[str, Float[Tensor, "N seq seq"]]:
        """Named detection patterns (0 / 1, lower triangular) per sequence, for :func:`detection_scores`."""
        return {}

    def describe(self) -> str:
        """The probe in a few words (default: its name)."""
        return f"probe {self.probe_name}"

    def controls(self, tokens: Int[Tensor, "N seq"]) -> dict[str, Int[Tensor, "N seq"]]:
        """Detection pattern -> control sequences for ``tokens``: the same layout with the pattern's content removed
        (the induction probe: the first copy replaced by unused tokens), whose attention on the pattern's entries is
        the pattern's null. Default: none (the null is uniform causal attention)."""
        return {}

    def lags(self) -> dict[str, Int[Tensor, " N"]]:
        """Detection pattern -> per scored sequence, the distance between the copies its targets come from (a head
        that copies at some of these only is a fixed-lag copier); default: none."""
        return {}

    def signals(self, model: nn.Module) -> ProbeSignals:
        """What the probe's pass records at each checkpoint (:class:`ProbeSignals`), from one forward of the scored
        sequences and their controls; the loss gap from ``loss_gap(model)`` where the probe has one."""
        tokens = self.scored_tokens()
        detections = self.detection_patterns(tokens)
        controls = self.controls(tokens)
        out = ProbeSignals({}, {}, {}, lags=self.lags())
        if detections:
            batch = torch.cat([tokens, *controls.values()])
            patterns = logits_and_patterns(model, batch, 0)[1]
            scored = patterns[: len(tokens)]
            offsets = {name: len(tokens) * (i + 1) for i, name in enumerate(controls)}
            for name, detection in detections.items():
                out.scores[name] = target_scores(scored, detection)
                out.detector[name] = detection_scores(scored, detection)
                if name in controls:
                    start = offsets[name]
                    out.nulls[name] = target_scores(patterns[start: start + len(tokens)], detection)
                else:
                    out.nulls[name] = chance_scores(detection)[:, None, None].expand_as(out.scores[name])
        if callable(getattr(self, "loss_gap", None)):
            gap = self.loss_gap(model)  # type: ignore[attr-defined]
            out.loss_gap = gap.detach().float().reshape(-1) if isinstance(gap, Tensor) else torch.tensor([float(gap)])
        return out


def probe_class(spec: str) -> type:
    """The probe class a name (:data:`BUILTIN_PROBES`), ``file.py:Class`` or ``module:Class`` names, checked
    for what a probe needs (module docstring); else a one-line ProbeError."""
    if spec in BUILTIN_PROBES:
        module, _, name = BUILTIN_PROBES[spec].partition(":")
        return getattr(importlib.import_module(module), name)
    source, sep, name = spec.rpartition(":")
    if not sep or not source or not name:
        raise ProbeError(f"--probe {spec}: not a built-in probe ({', '.join(BUILTIN_PROBES)}) and not of the form "
                         "file.py:Class or module:Class")
    try:
        module = _import_file(spec, source) if source.endswith(".py") else _import_module(spec, source)
    except TaskError as e:
        raise ProbeError(str(e).replace("--task", "--probe").replace("task file", "probe file")) from None
    cls = getattr(module, name, None)
    where = f"{source}:{name}"
    if cls is None:
        raise ProbeError(f"{source}: no class {name!r} in it (--probe {spec})")
    if not (inspect.isclass(cls) and issubclass(cls, Probe)):
        raise ProbeError(f"{where}: a probe must subclass plateauscope.Probe (and may subclass a task too)")
    if issubclass(cls, Task):
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            raise ProbeError(f"{where}: missing {', '.join(missing)} (required by plateauscope.Task, which it "
                             "subclasses; a probe need not be a task)")
        try:
            _check_class(spec, source, cls)
        except TaskError as e:
            raise ProbeError(str(e)) from None
    missing = [what for what, absent in (
        ("for_model (a classmethod: the probe for a model of d_vocab tokens and context n_ctx)",
         getattr(cls.for_model, "__func__", None) is Probe.for_model.__func__),
        ("a measure: detection_patterns(tokens), loss_gap(model) or prompt_pairs(n, seed)",
         cls.detection_patterns is Probe.detection_patterns and cls.head_scores is Probe.head_scores
         and not callable(getattr(cls, "loss_gap", None)) and not offers_pairs(cls))) if absent]
    if missing:
        raise ProbeError(f"{where}: missing {'; '.join(missing)}")
    if cls.probe_name == Probe.probe_name:
        cls.probe_name = cls.__name__
    if not re.fullmatch(r"[A-Za-z0-9_]+", str(cls.probe_name)):
        raise ProbeError(f"{where}: probe_name {cls.probe_name!r} must be letters, digits and '_' (it names "
                         "the results file)")
    return cls


def offers_pairs(probe: Any) -> bool:
    """Whether a probe (class or instance) brings prompt pairs: its own ``prompt_pairs``, or a task's with
    the ``pairs`` capability."""
    method = getattr(probe, "prompt_pairs", None)
    if not callable(method):
        return False
    cls = probe if inspect.isclass(probe) else type(probe)
    if issubclass(cls, Task):
        return "pairs" in cls.capabilities
    return True


def probe_code_error(e: BaseException, cls: type, spec: str, what: str) -> ProbeError:
    """A one-line ProbeError for an error raised while ``what`` ran: the probe file's function and line
    where it failed, when it failed in the probe's own file."""
    try:
        source = inspect.getsourcefile(cls)
    except TypeError:
        source = None
    inside = [f for f in traceback.extract_tb(e.__traceback__)
              if source is not None and Path(f.filename).resolve() == Path(source).resolve()]
    detail = f"{type(e).__name__}: {' '.join(str(e).split())}"
    if inside and spec not in BUILTIN_PROBES:
        return ProbeError(f"{source}: {inside[-1].name}() failed at line {inside[-1].lineno} ({detail})")
    return ProbeError(f"--probe {spec}: {what} failed ({detail})")


def check_probe(probe: Probe, d_vocab: int, n_pairs: int = 16) -> None:
    """What the analyses read of a built probe, on a sample: ``[N, seq]`` integer tokens in the vocabulary,
    ``[N, seq, seq]`` detection patterns, and prompt pairs whose tokens lie in the vocabulary; else a
    one-line ProbeError."""
    if type(probe).probe_tokens is Probe.probe_tokens and not hasattr(probe, "tokens"):
        raise ProbeError(f"probe {probe.probe_name}: missing tokens or probe_tokens() (its [N, seq] token ids)")
    tokens = probe.probe_tokens()
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int):
        got = f"{tokens.dtype} {list(tokens.shape)}" if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ProbeError(f"probe {probe.probe_name}: its tokens must be an [N, seq] tensor of token ids, got {got}")
    probe.check_vocab(d_vocab)
    scored = probe.scored_tokens()
    for name, pattern in probe.detection_patterns(scored).items():
        if not isinstance(pattern, Tensor) or tuple(pattern.shape) != (len(scored), scored.shape[1], scored.shape[1]):
            got = list(pattern.shape) if isinstance(pattern, Tensor) else type(pattern).__name__
            raise ProbeError(f"probe {probe.probe_name}: detection pattern {name!r} must be [N, seq, seq] = "
                             f"{[len(scored), scored.shape[1], scored.shape[1]]}, got {got}")
    if offers_pairs(probe):
        pairs = probe.prompt_pairs(n_pairs, 0)  # type: ignore[attr-defined]
        if not isinstance(pairs, PromptPairs):
            raise ProbeError(f"probe {probe.probe_name}: prompt_pairs() must return a plateauscope.PromptPairs, "
                             f"got {type(pairs).__name__}")
        for part in ("clean", "corrupt", "clean_answer", "corrupt_answer"):
            ids = getattr(pairs, part)
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= d_vocab):
                raise ProbeError(f"probe {probe.probe_name}: the prompt pairs' {part} token ids "
                                 f"{int(ids.min())}..{int(ids.max())} fall outside the model's vocabulary of "
                                 f"{d_vocab} tokens")


def build_probe(spec: str, d_vocab: int, n_ctx: int, seed: int = 0, tokenizer: Any = None, **options: Any) -> Probe:
    """The probe ``spec`` built for a model (``options``: the probe's own, e.g. ``segment_len``), checked
    against the vocabulary (:func:`check_probe`). ``tokenizer``: the model's (None: token ids only), handed to a
    ``for_model`` that takes a ``tokenizer`` argument; one that needs it, on a series without, is a ProbeError."""
    cls = probe_class(spec)
    wants = inspect.signature(cls.for_model).parameters.get("tokenizer")
    if wants is not None:
        if tokenizer is None and wants.default is inspect.Parameter.empty:
            raise ProbeError(f"--probe {spec}: its for_model needs the model's tokenizer, and the series has none "
                             "(token ids only: import checkpoints saved with their tokenizer files)")
        options = {**options, "tokenizer": tokenizer}
    try:
        probe = cls.for_model(d_vocab, n_ctx, seed, **options)
        check_probe(probe, d_vocab)
    except ProbeError as e:  # named by the probe, or by the probe's use of encode_texts / token_id
        raise e if str(e).startswith(("probe ", "--probe ")) else ProbeError(f"--probe {spec}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a probe file's code can fail in any way; say where
        named = ", ".join(k for k in options if k != "tokenizer")
        raise probe_code_error(e, cls, spec, f"{cls.__name__}.for_model({named})") from None
    return probe


def encode_texts(tokenizer: Any, texts: list[str]) -> Int[Tensor, "N seq"]:
    """Prompts written as text, as token ids of the model's tokenizer (no special tokens added): one row per
    text, all of one length, since a probe's prompts are read position by position; a ProbeError otherwise."""
    if tokenizer is None:
        raise ProbeError("the probe writes its prompts as text, and the series has no tokenizer (token ids only)")
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    for text, row in zip(texts, ids):
        if len(row) != len(ids[0]):
            raise ProbeError(f"the probe's prompts differ in length: {texts[0]!r} is {len(ids[0])} tokens, {text!r} "
                             f"{len(row)}; prompts are compared position by position")
    return torch.tensor(ids, dtype=torch.long)


def token_id(tokenizer: Any, text: str) -> int:
    """The one token id of ``text`` (an answer, or a token a position is found by); a ProbeError when the
    tokenizer makes it more or fewer than one token."""
    ids = encode_texts(tokenizer, [text])[0]
    if len(ids) != 1:
        raise ProbeError(f"the probe's token {text!r} is {len(ids)} tokens of the model's tokenizer, not one")
    return int(ids[0])


@torch.no_grad()
def logits_and_patterns(model: nn.Module, tokens: Int[Tensor, "N seq"], logits_rows: int | None = None
                        ) -> tuple[Float[Tensor, "n seq vocab"], Float[Tensor, "N n_layers n_heads seq seq"]]:
    """The logits of the first ``logits_rows`` sequences (None: all) and every layer's attention pattern on
    ``tokens``. One forward; where some sequences need no logits and the model keeps only the logits it is asked
    for (:func:`~plateauscope.model.backend.keeps_logits`), a second forward of those that unembeds one position."""
    n_layers = model.cfg.n_layers
    names = {get_act_name("pattern", layer) for layer in range(n_layers)}
    device = next(model.parameters()).device
    n = len(tokens) if logits_rows is None else logits_rows

    def run(rows: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        logits, cache = model.run_with_cache(rows.to(device), names_filter=lambda name: name in names, **kwargs)
        return logits, torch.stack([cache[get_act_name("pattern", layer)] for layer in range(n_layers)], dim=1)

    if n == len(tokens) or not keeps_logits(model):
        logits, patterns = run(tokens)
        return logits[:n].float().cpu(), patterns.float().cpu()
    scored = [run(tokens[:n])] if n else []
    last, rest = run(tokens[n:], logits_to_keep=1)
    logits = scored[0][0] if n else last.new_empty(0, tokens.shape[1], last.shape[-1])
    return logits.float().cpu(), torch.cat([p for _, p in scored] + [rest]).float().cpu()


def target_scores(patterns: Float[Tensor, "N n_layers n_heads seq seq"],
                  detection: Float[Tensor, "N seq seq"]) -> Float[Tensor, "N n_layers n_heads"]:
    """The field's score per sequence and head: the attention from each position where ``detection`` has a target
    to its targets, averaged over those positions (NaN in a sequence with none)."""
    rows = detection.sum(-1) > 0  # [N, seq]: positions with a target
    hit = (patterns * detection[:, None, None]).sum(-1)  # [N, L, H, seq]
    n_rows = rows.sum(-1).float()[:, None, None]
    return (hit * rows[:, None, None]).sum(-1) / n_rows.where(n_rows > 0, torch.nan)


def chance_scores(detection: Float[Tensor, "N seq seq"]) -> Float[Tensor, " N"]:
    """:func:`target_scores` of uniform causal attention (position ``q`` attends ``1 / (q + 1)`` to each key up to
    itself): the score of a head that does not look."""
    seq = detection.shape[-1]
    uniform = torch.tril(torch.ones(seq, seq)) / torch.arange(1, seq + 1)[:, None]
    return target_scores(uniform.expand(len(detection), 1, 1, seq, seq), detection)[:, 0, 0]


def detection_scores(patterns: Float[Tensor, "N n_layers n_heads seq seq"],
                     detection: Float[Tensor, "N seq seq"]) -> Float[Tensor, "n_layers n_heads"]:
    """``head_detector``'s ``mul`` score per head: attention on the detection pattern over all attention, per
    sequence, averaged over the sequences."""
    hit = (patterns * detection[:, None, None]).sum((-1, -2))
    return (hit / patterns.sum((-1, -2))).mean(0)
