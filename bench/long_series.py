"""A long series in flat memory, and a probe pass killed and resumed.

The series: a tiny GPT-NeoX (2 layers, 32 wide, 4 heads, vocabulary 128), 1,000 checkpoints saved by
``save_pretrained`` as ``checkpoint-N/`` folders, one AdamW step on repeated random tokens between two saves, in a
temporary folder. It is imported (``plateauscope.sources.importer.import_series``) and the induction probe's pass runs
over every checkpoint (``plateauscope.analysis.probe_pass.analyze_imported``), writing its per-step cache as it goes.

* **Memory**: resident memory (``VmRSS``) after the 10th checkpoint and after the last; target: at most 5% more.
* **Kill and resume**: the pass over the first 100 checkpoints, in a process killed with SIGKILL once its cache holds
  40 steps, then run again; the rerun computes only the steps the cache lacks, and the cache and the pass's record
  equal those of an uninterrupted pass, byte for byte.

    HF_HUB_OFFLINE=1 python bench/long_series.py [--checkpoints 1000]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from record import against, arguments, print_rows, row, save, yes_no

from plateauscope.analysis.probe_pass import analyze_imported
from plateauscope.analysis.results import probe_pass_path, probe_steps_path
from plateauscope.sources.importer import import_series

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TARGET_RSS_GROWTH = 5.0
KILL_SERIES, KILL_AFTER = 100, 40
"""The kill-and-resume check: its series' length, and the cached steps after which the pass is killed."""


def rss_mib() -> float:
    """Resident memory now (``VmRSS``), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write_series(out: Path, n: int) -> None:
    """``n`` checkpoints of the tiny model, one optimiser step apart."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(n):
        model.save_pretrained(out / f"checkpoint-{step}")
        first = torch.randint(1, 128, (8, 16))
        tokens = torch.cat([first, first], 1)
        model(tokens, labels=tokens).loss.backward()
        optimiser.step()
        optimiser.zero_grad()


def cache_files(run: Path) -> bytes:
    """The probe pass's per-step cache and its record, as bytes."""
    return probe_steps_path(run, "induction").read_bytes() + probe_pass_path(run, "induction").read_bytes()


def cached_steps(run: Path) -> int:
    """Lines in the per-step cache so far."""
    path = probe_steps_path(run, "induction")
    return path.read_text().count("\n") if path.exists() else 0


def killed_and_resumed(source: Path, tmp: Path) -> tuple[int, int, bool]:
    """(steps the killed process had cached, steps the rerun computed, whether the result equals an uninterrupted
    pass byte for byte) on the first :data:`KILL_SERIES` checkpoints."""
    steps = list(range(KILL_SERIES))
    whole, killed = tmp / "uninterrupted", tmp / "killed"
    for run in (whole, killed):
        import_series(source, run, steps=steps)
    analyze_imported(whole, progress=False)
    child = subprocess.Popen([sys.executable, "-c", "import sys; from plateauscope.analysis.probe_pass import "
                              "analyze_imported; analyze_imported(sys.argv[1], progress=False)", str(killed)])
    while cached_steps(killed) < KILL_AFTER and child.poll() is None:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    before = cached_steps(killed)
    computed: list[int] = []
    analyze_imported(killed, progress=False, on_step=computed.append)
    return before, len(computed), cache_files(killed) == cache_files(whole)


def main() -> int:
    """Write the series, import it, run the probe's pass with the memory read; then the kill and resume."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoints", type=int, default=1000)
    args = p.parse_args()
    rss: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "trainer_out"
        write_series(source, args.checkpoints)
        run = import_series(source, Path(tmp) / "run").path
        done: list[int] = []

        def on_step(step: int) -> None:
            done.append(step)
            if len(done) in (10, args.checkpoints):
                rss[len(done)] = rss_mib()

        start = time.perf_counter()
        analyze_imported(run, progress=False, on_step=on_step)
        per_step = (time.perf_counter() - start) / args.checkpoints
        before, computed, equal = killed_and_resumed(source, Path(tmp))
    n = args.checkpoints
    rows = [against(f"resident memory growth from checkpoint 10 to checkpoint {n}, import + probe pass of a tiny "
                    "GPT-NeoX", 100 * (rss[n] - rss[10]) / rss[10], "%", "<=", TARGET_RSS_GROWTH, "%"),
            row(f"resident memory at checkpoint {n}", rss[n], "MiB"),
            row("probe pass, per checkpoint", per_step, "s"),
            row(f"probe pass killed (SIGKILL) with {before} of {KILL_SERIES} steps cached: steps the rerun computed",
                computed, "steps"),
            against("steps the rerun computed beyond the missing ones", computed - (KILL_SERIES - before), "steps",
                    "<=", 0),
            yes_no("killed and rerun: the cache and the record equal an uninterrupted pass byte for byte", equal)]
    print_rows(rows)
    print(f"saved {save('long_series', rows, arguments(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
