"""``plateauscope import``: a checkpoint series written elsewhere, as a run directory the analyses read.

SOURCE is a folder of Hugging Face checkpoints (Trainer's checkpoint-N/, or any subfolders with
config.json and model.safetensors or pytorch_model.bin; the step is trainer_state.json's global_step,
else the last number in the folder's name), nanoGPT ckpt.pt files (the step is iter_num), TransformerLens
state dicts of a GPT-2-style model (HookedTransformer's or tools.training's model_N.pt, .pth or .safetensors,
with the config's fields as cfg.json beside them; the step is the last number in the file's name), or
hf-cache:ORG/NAME, the step revisions of a model in the local Hugging Face cache ($HF_HUB_CACHE, else
$HF_HOME/hub; nothing is downloaded): Pythia's stepN and OLMo's stepN-tokensM (the step is N), every one
cached or those --revisions names; or hf:ORG/NAME, the step revisions on the Hugging Face hub ($HF_ENDPOINT),
imported from the hub's listing without downloading weights (their sizes and SHA-256, the configs, the
safetensors headers; the tokenizer copied into RUN/model/): analyze fetches each revision when it reads
it (--keep N: at most N left in the cache). Nothing is copied: RUN/series.json lists each file with its step,
SHA-256 (checked on every read), format, architecture and tokenizer. Every chosen checkpoint is read
and checked first: a truncated file, a .pt that needs code to unpickle (refused, never loaded), a
folder that mixes architectures, a revision the cache lacks, or an unsupported architecture (an
encoder, a state-space model) is one line, exit code 2, and no directory is left. Identical weights
under two steps are named.

Supported: the decoder-only attention language models that TransformerLens 4's bridge loads (GPT-2,
GPT-NeoX/Pythia, Llama, Mistral, Qwen, OLMo, ...). One model is built per series and each checkpoint's
weights are loaded into it. The analyses run the bridge's own forward on them (on GPT-NeoX, patches
share the clean prefix through Hugging Face's cache); the fused and prefix-sharing fast paths cover
the runs trained here.

Then `plateauscope analyze --run RUN [--probe induction | file.py:Class] [--probe-length L]` runs the
probe's pass: head_detector's previous-token and induction scores, the in-context loss gap and its
change point, and exact head patching, at every checkpoint (RUN/analysis/probe_induction.json); on a
probe that is also a task, every analysis after it, on the probe's data. Analyses that need the
training data (the Hessian, grafting) refuse an imported run in one line; `plateauscope llc`
samples on the probe's sequences (not --per-head).

    plateauscope import runs/hf_trainer_out --out checkpoints/imported [--every 2 | --steps 0,100,200] [--log-spaced 30]
    plateauscope import hf-cache:EleutherAI/pythia-70m --out checkpoints/pythia [--revisions step0,step1000]
    plateauscope import hf:EleutherAI/pythia-70m --out checkpoints/pythia [--revisions step0,step1000 | --log-spaced 20]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tqdm.auto import tqdm

from plateauscope.analysis.probe_pass import ProbeSeriesResult
from plateauscope.cli.common import run_cli
from plateauscope.cli.parser import OneLineParser
from plateauscope.sources.hf_cache import parse_revisions
from plateauscope.sources.hf_hub import import_hub, is_hub_source
from plateauscope.sources.importer import import_series
from plateauscope.sources.selection import parse_steps
from plateauscope.views.phrases import probe_head_lines, transition_lines


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope import``."""
    p = OneLineParser(prog="plateauscope import", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("source", metavar="SOURCE", help="the series: a checkpoint folder, nanoGPT .pt files, TransformerLens "
                                                    "state dicts, hf-cache:ORG/NAME (step revisions in the local "
                                                    "Hugging Face cache) or hf:ORG/NAME (step revisions on the hub, "
                                                    "fetched by analyze)")
    p.add_argument("--out", type=Path, required=True, help="the run directory to write (new or empty)")
    p.add_argument("--every", type=int, default=1, help="import every N-th checkpoint (the last always)")
    p.add_argument("--steps", help="import these steps only, comma-separated (e.g. 0,100,200)")
    p.add_argument("--revisions", help="with hf-cache:ORG/NAME or hf:ORG/NAME: import these revisions only, "
                                       "comma-separated (e.g. step0,step1000 or step1000-tokens4B)")
    p.add_argument("--log-spaced", type=int, metavar="N", help="about N checkpoints spaced evenly in log(step)")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where the weights are checked (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def format_probe_series(result: ProbeSeriesResult) -> str:
    """The probe's pass over an imported series, as text: one line per step, the heads its rule names, the loss
    gap's transition (the sentences the report writes, from the same record)."""
    names = list(result.heads)
    lines = [f"probe {result.probe} on {len(result.steps)} checkpoints of {result.architecture}: {result.layout}",
             f"{'step':>8}  {'loss gap':>9}  " + "  ".join(f"max {name}" for name in names)]
    for r in result.steps:
        gap = "-" if r.loss_gap is None else f"{r.loss_gap:9.4f}"
        tops = "  ".join(f"{max(v for row in r.head_scores[name] for v in row if v is not None):>{4 + len(name)}.3f}"
                         for name in names)
        lines.append(f"{r.step:>8}  {gap:>9}  {tops}")
    record = result.to_dict()
    return "\n".join([*lines, *probe_head_lines(record), *transition_lines(record)])


def main(argv: list[str] | None = None) -> int:
    """``plateauscope import``: write the run directory and print one line about it."""
    def body(args: argparse.Namespace) -> None:
        steps = parse_steps(args.steps)
        revisions = parse_revisions(args.revisions)
        bar = None

        def progress(i: int, n: int) -> None:
            nonlocal bar
            if bar is None:
                bar = tqdm(total=n, desc=f"import {Path(args.source).name}", disable=args.no_progress,
                           dynamic_ncols=True)
            bar.update(1)

        try:
            reader = import_hub if is_hub_source(args.source) else import_series
            result = reader(args.source, args.out, args.every, steps, args.log_spaced, args.device, progress, revisions)
        finally:
            if bar is not None:
                bar.close()
        tokenizer = result.tokenizer or "none (token ids)"
        print(f"{result.path}: {len(result.steps)} checkpoints of {result.architecture}, steps "
              f"{result.steps[0]}..{result.steps[-1]}, tokenizer {tokenizer}")
        for a, b in result.duplicates:
            print(f"warning: steps {a} and {b} have identical weights")

    return run_cli(body, argv, build_parser())
