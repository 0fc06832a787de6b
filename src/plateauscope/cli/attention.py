"""``plateauscope attention``: the command line of :mod:`plateauscope.analysis.attention`."""

from __future__ import annotations

import argparse

import plateauscope.analysis.attention as _module
from plateauscope.analysis.attention import attention_to_z, head_table
from plateauscope.cli.common import add_ckpt_args, resolve_ckpt, run_cli, write_json
from plateauscope.cli.parser import OneLineParser
from plateauscope.cli.text.tables import format_table


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``plateauscope attention``."""
    parser = OneLineParser(prog="plateauscope attention", description=_module.__doc__.splitlines()[0])
    add_ckpt_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``plateauscope attention``: attention to the task's cue per head at one checkpoint."""
    parser = build_parser()

    def body(args: argparse.Namespace) -> None:
        run, step = resolve_ckpt(args.ckpt, args.step)
        model = run.model(step, device=args.device, backend=args.backend)
        res = attention_to_z(model, run.task(), args.n_examples, args.seed)
        print(f"{run.path} step {step}: attention from the prediction position to the cue "
              f"({res.n_examples} examples); top head L{res.top_head()[0]}H{res.top_head()[1]}")
        for title, values in (("attention to the cue, prediction position", res.to_z_first),
                              ("attention to the cue, every loss position", res.to_z_all_targets),
                              ("attention entropy (nats), prediction position", res.entropy_first)):
            print(f"\n{title}")
            print(format_table(*head_table(values)))
        write_json(args.json, {"run": str(run.path), "step": step, "seed": args.seed, **res.to_dict()})

    return run_cli(body, argv, parser)


if __name__ == "__main__":
    raise SystemExit(main())
