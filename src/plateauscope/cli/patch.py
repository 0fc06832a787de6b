"""``plateauscope patch``: the command line of :mod:`plateauscope.analysis.patch`."""

from __future__ import annotations

import argparse
import math
from typing import Any

import plateauscope.analysis.patch as _module
from plateauscope.analysis.attribution import agreement, attribute
from plateauscope.analysis.components import TARGETS, PatchResult
from plateauscope.analysis.inputs import prompt_pairs
from plateauscope.analysis.patch import patch
from plateauscope.cli.common import (
    CliError,
    add_ckpt_args,
    resolve_ckpt,
    run_cli,
    write_json,
)
from plateauscope.cli.parser import OneLineParser
from plateauscope.cli.text.analysis import format_result


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope patch``."""
    p = OneLineParser(prog="plateauscope patch", description=_module.__doc__.split("\n\n")[0])
    add_ckpt_args(p)
    p.add_argument("--target", default="heads", choices=TARGETS, help="component set to patch (default heads)")
    p.add_argument("--method", default="exact", choices=("exact", "attribution", "both"),
                   help="exact patching, attribution patching (first-order, fast), or both and their agreement")
    p.add_argument("--top", type=int, default=10, help="components to list, by |effect| (default 10)")
    p.add_argument("--max-batch", type=int, default=4096, help="rows per forward pass (default 4096)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """``plateauscope patch``: exact and/or attribution patching at one checkpoint, as a table."""
    def body(args: argparse.Namespace) -> None:
        if args.n_examples < 1 or args.top < 0 or args.max_batch < 1:
            raise CliError("--n-examples and --max-batch must be >= 1, --top >= 0")
        run, step = resolve_ckpt(args.ckpt, args.step)
        task = run.task()
        pairs = prompt_pairs(task, args.n_examples, args.seed)
        model = run.model(step, device=args.device, backend=args.backend)
        pos_names = task.position_labels(pairs.corrupt.shape[1])
        results: dict[str, PatchResult] = {}
        if args.method in ("exact", "both"):
            results["exact"] = patch(model, pairs, args.target, max_batch=args.max_batch,
                                     progress=not args.no_progress)
        if args.method in ("attribution", "both"):
            results["attribution"] = attribute(model, pairs, args.target)
        out: dict[str, Any] = {"ckpt": str(args.ckpt), "run": str(run.path), "step": step,
                               "n_examples": pairs.corrupt.shape[0], "seed": args.seed,
                               "positions": pos_names}
        print(f"{run.path} step {step}")
        for name, res in results.items():
            print()
            print(format_result(res, pos_names, args.top))
            out[name] = res.to_dict()
        if len(results) == 2:
            agree = agreement(results["exact"], results["attribution"])
            print(f"\nattribution vs exact: spearman {agree['spearman']:+.3f}, "
                  f"max |error| {agree['max_abs_err']:.4f} logits")
            out["agreement"] = {k: (v if math.isfinite(v) else None) for k, v in agree.items()}
        write_json(args.json, out)

    return run_cli(body, argv, build_parser())
