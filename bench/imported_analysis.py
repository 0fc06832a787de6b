"""The whole analysis of an imported series, part by part, against a user's own probe loop over it.

The series: a 3-layer, 64-wide GPT-NeoX (4 heads, vocabulary 2048, 0.41M parameters), trained on repeated random
tokens (a copy of 12, twice) and saved with ``save_pretrained`` every 10 optimiser steps, 50 checkpoints, in a
temporary folder.

* **the user's loop**: for each checkpoint, ``AutoModelForCausalLM.from_pretrained``, then one forward of the induction
  probe's sequences under ``torch.inference_mode()`` with ``output_attentions=True``: each head's mean attention to
  the induction target and the in-context loss gap (the probe's own arithmetic) (what a researcher writes to see the phase change);
* **plateauscope**: ``plateauscope import`` then ``plateauscope analyze`` as a new user runs them, and the same
  analysis part by part, each in its own process (its wall time and peak resident memory, ``wait4``'s
  ``ru_maxrss``): the import, the probe's pass (head scores and their nulls, the loss gap, exact head patching),
  the probe's evaluation (the metrics tau and the plateau read), the cheap pass without the edges, the edges' cheap
  pass, and the expensive pass at the landmarks (exact patching, circuit, ablation, the edge circuit).

Targets (issue 72): the whole ``analyze`` within 10x the user's loop, peak resident memory <= 1.5 GB.

``--shape pythia-70m`` (or another of ``bench/import_series.py``'s shapes) measures, instead, what one checkpoint of
the whole analysis costs at that shape, for the manual's projection: a two-checkpoint series (a seeded init, then
two optimiser steps), imported, with the probe's pass and evaluation; then, in one process and on one model, each
cheap analysis at the last checkpoint (what every checkpoint costs) and each analysis of the expensive pass (what a
landmark costs), as ``analyze`` computes them. No target: saved as the part ``landmark-<shape>``.

    HF_HUB_OFFLINE=1 python bench/imported_analysis.py [--checkpoints 50]
    HF_HUB_OFFLINE=1 python bench/imported_analysis.py --shape pythia-70m
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from record import against, arguments, print_rows, row, save

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TARGET_RATIO = 10.0
TARGET_RSS_GB = 1.5
VOCAB, CONTEXT, COPY = 2048, 256, 12
STEPS_BETWEEN = 10
"""Optimiser steps between two saved checkpoints."""

PARTS = {
    "import": "from plateauscope.sources.importer import import_series; import_series(SOURCE, RUN)",
    "probe pass": "from plateauscope.analysis.probe_pass import analyze_imported; analyze_imported(RUN, progress=False)",
    "probe evaluation": "from plateauscope.runs.imported import record_probe; from plateauscope.runs.run import Run; "
                        "record_probe(RUN, 'induction', {}); r = Run(RUN); r.evaluate(r.steps, 'cpu')",
    "cheap pass": "from plateauscope.analysis.analyze import analyze_run; "
                  "analyze_run(RUN, progress=False, expensive=False, edges=False)",
    "cheap pass of the edges": "from plateauscope.analysis.analyze import analyze_run; "
                               "analyze_run(RUN, progress=False, expensive=False)",
    "expensive pass (landmarks)": "from plateauscope.analysis.analyze import analyze_run; analyze_run(RUN, progress=False)",
}
"""Each part of the whole analysis, as the API runs it; each reads the cache the parts before it wrote."""


def write_series(out: Path, n: int) -> None:
    """``n`` checkpoints of the model, trained on copies (``checkpoint-{10 i}/``)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                           intermediate_size=256, max_position_embeddings=CONTEXT, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for i in range(n):
        model.save_pretrained(out / f"checkpoint-{STEPS_BETWEEN * i}")
        for _ in range(STEPS_BETWEEN):
            first = torch.randint(1, VOCAB, (32, 2 * COPY))
            tokens = torch.cat([first, first[:, :COPY], first[:, COPY:]], 1)
            loss = model(tokens, labels=tokens).loss
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()


def users_loop(source: Path) -> float:
    """Seconds of the loop a user writes over the series (module docstring)."""
    from transformers import AutoModelForCausalLM

    from plateauscope.tasks.probe import build_probe, target_scores

    probe = build_probe("induction", VOCAB, CONTEXT)
    tokens = probe.scored_tokens()
    detection = probe.detection_patterns(tokens)["induction"]
    folders = sorted(source.iterdir(), key=lambda f: int(f.name.split("-")[1]))
    start = time.perf_counter()
    with torch.inference_mode():
        for folder in folders:
            model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")  # returns its attention
            out = model(tokens, output_attentions=True)
            scores = target_scores(torch.stack(out.attentions, 1), detection).nanmean(0)  # [layer, head]
            gap = probe.copy_gaps(out.logits, tokens).mean()  # loss on the first copy minus the second
            assert scores.isfinite().all() and gap.isfinite()
    return time.perf_counter() - start


def timed_process(code: str, **names: str) -> tuple[float, float]:
    """Wall seconds and peak resident memory (MiB) of ``python -c code`` (``names``: constants it reads)."""
    prelude = "".join(f"{k} = {v!r}\n" for k, v in names.items())
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", prelude + code], stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"{code[:60]}...: {proc.stderr.read().strip().splitlines()[-1:]}")
    return seconds, usage.ru_maxrss / 1024


def step_costs(shape: str) -> list[dict]:
    """Seconds of each analysis at one checkpoint of a series of ``shape`` (module docstring)."""
    from import_series import SHAPES
    from import_series import write_series as write_shaped

    from plateauscope.analysis.analyze import CHEAP, EXPENSIVE, AnalysisSettings, SeriesAnalysis
    from plateauscope.analysis.edges import edge_and_attribution_records
    from plateauscope.analysis.measures import attention_and_measures, measure_inputs
    from plateauscope.analysis.probe_pass import analyze_imported
    from plateauscope.runs.run import Run
    from plateauscope.sources.importer import import_series

    if shape not in SHAPES:
        sys.exit(f"--shape: {shape!r} is none of {', '.join(SHAPES)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        steps = write_shaped(Path(tmp) / "source", shape, 2, 2)
        run_dir = Path(tmp) / "run"
        import_series(Path(tmp) / "source", run_dir)
        analyze_imported(run_dir, progress=False)
        run = Run(run_dir)
        run.evaluate(run.steps, "cpu")
        analysis = SeriesAnalysis(run, AnalysisSettings(), "cpu", None, 1, True, False)
        model = run.model(steps[-1], "cpu")
        analysis.inputs = measure_inputs(run, analysis.settings.n_examples, analysis.settings.seed, "cpu", None, model)
        before, fresh = {name: {} for name in (*CHEAP, *EXPENSIVE)}, {}
        task, pairs, targets = analysis.task, analysis.pairs, analysis.settings.patch_targets
        shared = {  # what the cheap pass computes together (SeriesAnalysis.run_pass)
            "attention and measures": lambda: attention_and_measures(model, task, analysis.inputs),
            "edges and attribution": lambda: edge_and_attribution_records(model, pairs, targets)}
        parts = [("every checkpoint (cheap pass)", "attention and measures"),
                 ("every checkpoint (cheap pass)", "edges and attribution"),
                 ("every checkpoint (cheap pass)", "patterns"), *(("a landmark (expensive pass)", n) for n in EXPENSIVE)]
        totals: dict[str, float] = {}
        for what, name in parts:
            start = time.perf_counter()
            if name in shared:
                for made, record in zip(name.split(" and "), shared[name]()):
                    fresh[made] = record
            else:
                fresh[name] = analysis.compute(name, steps[-1], model, fresh, before)
            spent = time.perf_counter() - start
            totals[what] = totals.get(what, 0.0) + spent
            print(f"{name}: {spent:.1f} s", file=sys.stderr)
            rows.append(row(f"part: {shape}, {what}: {name}", spent, "s"))
        rows += [row(f"part: {shape}, {what}: all of it", total, "s") for what, total in totals.items()]
    return rows


def main() -> int:
    """Build the series; time the user's loop, the whole command and each part; save the rows."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoints", type=int, default=50)
    p.add_argument("--shape", help="time one checkpoint's analyses at this shape instead (module docstring)")
    args = p.parse_args()
    if args.shape:
        rows = step_costs(args.shape)
        print_rows(rows)
        print(f"saved {save('imported_analysis', rows, arguments(args), part=f'landmark-{args.shape}')}")
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "trainer_out"
        write_series(source, args.checkpoints)
        theirs = users_loop(source)
        print(f"the user's loop: {theirs:.1f} s", file=sys.stderr)
        run = str(Path(tmp) / "whole")
        command = ("import sys; from plateauscope.cli import main; "
                   "sys.exit(main(['import', SOURCE, '--out', RUN]) or main(['analyze', '--run', RUN, '--no-progress']))")
        whole, whole_rss = timed_process(command, SOURCE=str(source), RUN=run)
        print(f"plateauscope import + analyze: {whole:.1f} s, {whole_rss:.0f} MiB", file=sys.stderr)
        rows += [against(f"plateauscope import + analyze vs the user's probe loop, {args.checkpoints} checkpoints of a "
                         "0.41M-parameter GPT-NeoX", whole / theirs, "x", "<=", TARGET_RATIO),
                 row("plateauscope import + analyze", whole, "s"), row("the user's probe loop", theirs, "s"),
                 against("peak resident memory of import + analyze", whole_rss * 2**20 / 1e9, "GB", "<=",
                         TARGET_RSS_GB)]
        parts, spent = str(Path(tmp) / "parts"), {}
        for name, code in PARTS.items():
            spent[name], rss = timed_process(code, SOURCE=str(source), RUN=parts)
            print(f"{name}: {spent[name]:.1f} s, {rss:.0f} MiB", file=sys.stderr)
            rows += [row(f"part: {name}", spent[name], "s"), row(f"part: {name}, peak resident memory", rss, "MiB")]
        rows.append(against("import + the probe's pass (analyze --probe-only; the two parts) vs the user's probe loop",
                            (spent["import"] + spent["probe pass"]) / theirs, "x", "<=", TARGET_RATIO))
    print_rows(rows)
    print(f"saved {save('imported_analysis', rows, arguments(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
