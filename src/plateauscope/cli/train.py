"""``plateauscope train``: the command line of :mod:`plateauscope.training.train`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from plateauscope.cli.parser import OneLineParser
from plateauscope.errors import ConfigError
from plateauscope.model.backend import BACKENDS, BackendError
from plateauscope.model.config import CHECKPOINT_POLICIES, FORWARDS, PART_FORMS
from plateauscope.runs import run as rd
from plateauscope.runs.config import RunConfig
from plateauscope.runs.metrics import PLATEAU_COUNTS, plateau_stretch
from plateauscope.runs.presets import PRESETS, run_config
from plateauscope.tasks.loading import BUILTIN_TASKS, task_class
from plateauscope.training.train import default_run_name, train
from plateauscope.views.phrases import plateau_sentence


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def head_list(text: str) -> tuple[str, ...]:
    """``"0.1, 0.2"`` as ``("0.1", "0.2")`` (each head is checked against the model when the run starts)."""
    return tuple(h.strip() for h in text.split(",") if h.strip())


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope train``."""
    p = OneLineParser(
        prog="plateauscope train",
        description="Train a HookedTransformer on a task (the (B, z) -> A selector task unless --task says "
                    "otherwise), writing dense checkpoints, metrics.jsonl and summary.json into a run directory.")
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="starting configuration (default: demo; with --task, the task's own defaults)")
    p.add_argument("--task", help=f"the task: a built-in one ({', '.join(BUILTIN_TASKS)}), or your own as "
                                  "path/to/file.py:Class or module:Class (default: the preset's task)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the task (or of the model or training config), repeatable: e.g. "
                        "--set K=8 --set order=zb; a wrong name lists the valid ones")
    p.add_argument("--seed", type=int, help="seed of the initialisation and the data order")
    p.add_argument("--data-seed", type=int, help="seed of the data set itself (the task's seed option)")
    p.add_argument("--lr", type=float, help="AdamW learning rate")
    p.add_argument("--batch-size", type=int, help="examples per step")
    p.add_argument("--full-batch", action="store_true", default=None,
                   help="every step's batch is the whole training split (--batch-size is then unused)")
    p.add_argument("--max-steps", type=int, help="steps to train at most (with --resume, a larger value extends a "
                                                 "finished run, bit for bit as one longer run)")
    p.add_argument("--stop-after-tau", type=float, help="stop at this multiple of tau once tau is seen")
    p.add_argument("--threads", type=int, help="torch intra-op threads")
    p.add_argument("--forward", choices=FORWARDS,
                   help="the training step's forward: fused (default; fused kernels over the model's own "
                        "parameters, 1.5x faster), trimmed (fused, the last block only at the loss positions: "
                        "1.15-1.4x faster again) or hooked (HookedTransformer's own forward). Evaluation and "
                        "checkpoints are the same in all three")
    p.add_argument("--checkpoints", choices=CHECKPOINT_POLICIES,
                   help="which checkpoints to keep: dense (every ckpt_every steps) or adaptive (dense only from "
                        "the plateau's middle to 1.3 tau, every coarse_every steps elsewhere; the same bytes)")
    p.add_argument("--hide-cue-until", type=int, metavar="S",
                   help="intervention: mask attention to the cue (z) in every head before step S, then release it")
    p.add_argument("--mask-heads", type=head_list,
                   metavar="L.H,...", help="intervention: zero these heads' outputs from step 0, e.g. 0.1,0.2,0.3")
    p.add_argument("--clamp-heads", type=head_list, metavar="L.H,...",
                   help="intervention: clamp these heads' attention pattern P to (1 - a) P + a T, T the task's "
                        "--clamp-rule (default: the cue)")
    p.add_argument("--clamp-rule", metavar="NAME", help="the clamp's target, a named attention rule of the task "
                                                        "(cue; for induction also 'previous token')")
    p.add_argument("--clamp-strength", type=float, metavar="A", help="the clamp's a in [0, 1] (default 1)")
    p.add_argument("--clamp-from", type=int, metavar="S1", help="the first step of the clamp (default 0)")
    p.add_argument("--clamp-until", type=int, metavar="S2", help="the first step without the clamp (default: never)")
    p.add_argument("--mean-value-heads", type=head_list, metavar="L.H,...",
                   help="intervention: replace these heads' values by their mean from --ablate-from (pattern kept)")
    p.add_argument("--freeze-qk-heads", type=head_list, metavar="L.H,...",
                   help="intervention: keep these heads' W_Q, W_K and biases from --ablate-from on (OV trains)")
    p.add_argument("--ablate-from", type=int, metavar="S", help="the first step of the pattern-preserving ablations")
    p.add_argument("--transplant", metavar="PART",
                   help="intervention: start from the run's own step-0 weights with this part from --donor "
                        f"({PART_FORMS}; routing: embeddings and layer 0; readout: the layers above, final norm, "
                        "unembedding)")
    p.add_argument("--donor", help="the checkpoint (.safetensors, same model shape) that --transplant copies from")
    p.add_argument("--freeze-transplant", action="store_true", default=None,
                   help="keep the transplanted weights fixed during training")
    p.add_argument("--out", type=Path, help="run directory (default: checkpoints/<name from the options>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--device", default="auto", help="auto (a GPU when present), cpu or cuda")
    p.add_argument("--backend", choices=BACKENDS,
                   help="hooked: TransformerLens 3.x HookedTransformer; bridge: TransformerLens 4.x TransformerBridge "
                        "(default: the installed one). One seed trains the same run on both, and a run resumes on either")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The preset (or, with ``--task`` alone, the task's defaults) with the command line's overrides
    applied, validated (:func:`plateauscope.runs.presets.run_config`)."""
    overrides = {name: getattr(args, attr) for name, attr in [
        ("seed", "seed"), ("lr", "lr"), ("batch_size", "batch_size"), ("full_batch", "full_batch"),
        ("max_steps", "max_steps"),
        ("stop_after_tau", "stop_after_tau"), ("threads", "threads"), ("forward", "forward"),
        ("checkpoints", "checkpoints"),
        ("hide_cue_until", "hide_cue_until"), ("masked_heads", "mask_heads"), ("transplant", "transplant"),
        ("donor", "donor"), ("freeze_transplant", "freeze_transplant"), ("clamp_heads", "clamp_heads"),
        ("clamp_rule", "clamp_rule"), ("clamp_strength", "clamp_strength"), ("clamp_from", "clamp_from"),
        ("clamp_until", "clamp_until"), ("mean_value_heads", "mean_value_heads"),
        ("frozen_qk_heads", "freeze_qk_heads"), ("ablate_from", "ablate_from")] if getattr(args, attr) is not None}
    return run_config(args.preset, args.task, args.set, data_seed=args.data_seed, **overrides)


def main(argv: list[str] | None = None) -> int:
    """``plateauscope train``: train one run; errors are one line and exit code 2."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = config_from_args(args)
        out = args.out or Path("checkpoints") / default_run_name(cfg)
        summary = train(cfg, out, resume=args.resume, device=args.device, progress=not args.no_progress,
                        backend=args.backend)
    except (ConfigError, rd.RunError, BackendError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: resume with --resume --out {out}", file=sys.stderr)
        return 130
    tau = summary.get("tau")
    measure = task_class(cfg.task_name).generate(cfg.task).progress
    # the plateau by the analysis's rule (counts and the longest in-band stretch); an older summary.json
    # (written with plateau_span) has its counts computed here from the run's metrics
    counts = summary.get(PLATEAU_COUNTS) or plateau_stretch(rd.read_jsonl(out / rd.METRICS_FILE), measure, tau)
    plateau = summary.get("plateau") or {}
    metric = (plateau.get("know_nothing") or {}).get("metric", "set_loss")
    verdict = (f"plateau verdict {plateau.get('verdict') or 'none'} (median {metric.replace('_', ' ')} "
               f"{_fmt(plateau.get(f'median_{metric}'))}, know-nothing {_fmt(plateau['know_nothing'].get(metric))}); "
               if plateau and counts["holds"] else "")  # a verdict only on a plateau its counts support
    plateau_text = plateau_sentence(counts, measure.label, measure.height_label).rstrip(".")
    print(f"{f'tau = {tau} steps' if tau is not None else 'tau not reached'} ({measure.height_name} = "
          f"{summary[measure.height_name]:.3f}); {plateau_text[0].lower() + plateau_text[1:]}; {verdict}run in {out}")
    return 0
