"""The token vocabulary and the one sequence layout every example uses.

A sequence is::

    backward (B, z) -> A:   <BOS> b1 .. b6 <SEP> z1 z2 <SEP> a1 .. a4
    forward  A -> B:        <BOS> a1 .. a4 <SEP> b1 .. b6

with the task's variants: ``order=zb`` puts z before B (``<BOS> z1 z2 <SEP> b1 .. b6 <SEP> a1 ..``),
``no_z`` drops z and its ``<SEP>`` (``<BOS> b1 .. b6 <SEP> a1 ..``), and the lengths are the task's
``b_len``, ``z_len`` and ``a_len``.

i.e. ``<BOS>``, the source segments each followed by ``<SEP>``, then the target. There is
no end token and no padding: every sequence of a run has the same length. The training
loss is the cross-entropy of the target tokens only; the logits at position ``p`` predict
the token at ``p + 1``, so the target is predicted from ``target_start - 1`` onwards and the
last target token is never fed back (``input_len`` stops one short of the full sequence).

Every position an analysis needs comes from :class:`Layout`; nothing else in the code base
writes a position as a literal.
"""

from __future__ import annotations

from dataclasses import dataclass

from plateauscope.tasks.selector_config import TaskConfig

BOS = "<BOS>"
SEP = "<SEP>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS, SEP)


def vocabulary(alphabet: str) -> list[str]:
    """Token strings in id order: the special tokens, then the alphabet."""
    return [*SPECIAL_TOKENS, *alphabet]


@dataclass(frozen=True)
class Layout:
    """Positions of each segment in a sequence. Spans are ``(start, stop)``, stop exclusive."""

    direction: str
    b_span: tuple[int, int]
    z_span: tuple[int, int] | None
    a_span: tuple[int, int]
    seq_len: int

    @classmethod
    def for_task(cls, task: TaskConfig) -> Layout:
        """The layout of a task configuration (its direction, order, lengths and whether it has z)."""
        lengths = {"b": task.b_len, "z": task.z_len, "a": task.a_len}
        if task.direction == "forward":
            order: tuple[str, ...] = ("a", "b")
        elif task.no_z:
            order = ("b", "a")
        else:
            order = ("z", "b", "a") if task.order == "zb" else ("b", "z", "a")
        spans: dict[str, tuple[int, int]] = {}
        pos = 1  # after <BOS>
        for i, name in enumerate(order):
            spans[name] = (pos, pos + lengths[name])
            pos += lengths[name] + (1 if i < len(order) - 1 else 0)  # a <SEP> after each source
        return cls(task.direction, spans["b"], spans.get("z"), spans["a"], pos)

    @property
    def target_span(self) -> tuple[int, int]:
        """Where the answer is: A going backward, B going forward."""
        return self.a_span if self.direction == "backward" else self.b_span

    @property
    def source_spans(self) -> list[tuple[int, int]]:
        """The prompt's segments before the target, in sequence order."""
        spans = [self.b_span, self.z_span] if self.direction == "backward" else [self.a_span]
        return sorted(s for s in spans if s is not None)

    @property
    def target_len(self) -> int:
        """Number of target tokens (the answer's length)."""
        return self.target_span[1] - self.target_span[0]

    @property
    def first_target_pred_pos(self) -> int:
        """The position whose logits predict the first target token (the last ``<SEP>``)."""
        return self.target_span[0] - 1

    @property
    def target_pred_positions(self) -> list[int]:
        """Positions whose logits predict the target tokens, in order."""
        start, stop = self.target_span
        return list(range(start - 1, stop - 1))

    @property
    def input_len(self) -> int:
        """Tokens fed to the model: the sequence without its last token."""
        return self.seq_len - 1

    @property
    def sep_positions(self) -> list[int]:
        """Positions of the ``<SEP>`` tokens."""
        return [span[1] for span in self.source_spans]

    def to_dict(self) -> dict:
        """Plain JSON types, as stored in ``config.json``."""
        return {
            "direction": self.direction,
            "seq_len": self.seq_len,
            "input_len": self.input_len,
            "b_span": list(self.b_span),
            "z_span": list(self.z_span) if self.z_span else None,
            "a_span": list(self.a_span),
            "target_span": list(self.target_span),
            "first_target_pred_pos": self.first_target_pred_pos,
            "target_pred_positions": self.target_pred_positions,
            "sep_positions": self.sep_positions,
        }
