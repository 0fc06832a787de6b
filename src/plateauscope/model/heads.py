"""The name of an attention head everywhere in this project: ``L{layer}H{head}``."""

from __future__ import annotations


def head_label(layer: int, head: int) -> str:
    """``L{layer}H{head}``, e.g. ``L0H2``."""
    return f"L{int(layer)}H{int(head)}"


def parse_head_label(label: str, n_layers: int, n_heads: int) -> tuple[int, int]:
    """``"L0H1"`` (or ``"0.1"``) as (layer, head); a one-line ValueError for a head the model lacks."""
    text = str(label).strip().upper()
    layer, sep, head = text[1:].partition("H") if text.startswith("L") else text.partition(".")
    if not sep or not layer.isdigit() or not head.isdigit():
        raise ValueError(f"head {label!r}: write heads as L0H1 (or 0.1)")
    if int(layer) >= n_layers or int(head) >= n_heads:
        raise ValueError(f"head {label} does not exist: the model has {n_layers} layer(s) of {n_heads} heads")
    return int(layer), int(head)
