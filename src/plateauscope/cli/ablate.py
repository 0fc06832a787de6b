"""``plateauscope ablate``: the command line of :mod:`plateauscope.analysis.ablate`."""

from __future__ import annotations

import argparse

import plateauscope.analysis.ablate as _module
from plateauscope.analysis.ablate import (
    DEFAULT_GROUPS,
    KINDS,
    ablate_each_head,
    falls_back_to_marginal,
)
from plateauscope.analysis.attention import head_table
from plateauscope.cli.common import CliError, add_ckpt_args, resolve_ckpt, run_cli, write_json
from plateauscope.cli.parser import OneLineParser
from plateauscope.cli.text.tables import format_table


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``plateauscope ablate``."""
    parser = OneLineParser(prog="plateauscope ablate", description=_module.__doc__.splitlines()[0])
    add_ckpt_args(parser)
    parser.add_argument("--kind", choices=KINDS, default="zero",
                        help="zero, mean or cue_mean ablation (default zero; cue_mean needs a task with candidates)")
    parser.add_argument("--groups", type=int, default=DEFAULT_GROUPS,
                        help=f"evaluation examples to score (default {DEFAULT_GROUPS}); --n-examples is not used")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``plateauscope ablate``: ablate each head of one checkpoint and print the table."""
    parser = build_parser()

    def body(args: argparse.Namespace) -> None:
        run, step = resolve_ckpt(args.ckpt, args.step)
        if args.groups < 1:
            raise CliError(f"--groups must be at least 1, got {args.groups}")
        model = run.model(step, device=args.device, backend=args.backend)
        res = ablate_each_head(model, run.task(), args.kind, args.groups, args.seed)
        log_k, progress = run.log_k, run.progress
        label, height = progress.label, progress.height_label
        cue = f", {progress.cue_effect_key} {res.base['delta_z']:.3f}" if progress.cue_effect_key else ""
        print(f"{run.path} step {step}: {args.kind} ablation of each head, {res.n_groups} evaluation examples; "
              f"unablated {label} {res.base['candidate_loss']:.3f} ({height} {log_k:.3f}){cue}")
        print(f"\nchange in {label} (ablated - unablated)")
        print(format_table(*head_table(res.d_candidate_loss)))
        i = int(res.d_candidate_loss.nan_to_num().flatten().abs().argmax())
        layer, head = divmod(i, model.cfg.n_heads)
        back = falls_back_to_marginal(res, layer, head, log_k)
        change = float(res.d_candidate_loss[layer, head])
        print(f"\nlargest change: L{layer}H{head}, {label} {float(res.candidate_loss[layer, head]):.3f} "
              f"({change:+.3f}); returns to {height} (within 0.25 {height}): {'yes' if back else 'no'}")
        falls_back = [[falls_back_to_marginal(res, la, h, log_k) for h in range(model.cfg.n_heads)]
                      for la in range(model.cfg.n_layers)]
        write_json(args.json, {"run": str(run.path), "step": step, "seed": args.seed, "height": log_k,
                               **res.to_dict(), "falls_back_to_marginal": falls_back})

    return run_cli(body, argv, parser)


if __name__ == "__main__":
    raise SystemExit(main())
