"""A series on the hub fetched just in time: the disk it holds, and its time against fetching everything first.

The series: a 2-layer, 128-wide GPT-NeoX (4 heads, vocabulary 4096, 1.4M parameters, about 5.8 MB a checkpoint in
safetensors), trained on repeated random tokens with one AdamW step between two saves, 50 saves, served as the step
revisions ``step0`` .. ``step49`` of ``EleutherAI/bench-pythia`` by the tests' hub on 127.0.0.1
(:mod:`tests.sources.hub_server`, the routes and headers that ``huggingface_hub`` reads). Each child process below
reaches it through ``HF_ENDPOINT``, with its own empty ``HF_HUB_CACHE`` (a temporary folder) and a fresh run
directory, and runs the command line as a user does (``python -m plateauscope``):

* **(a) just in time**: ``plateauscope import hf:...`` then ``plateauscope analyze --run RUN --probe-only --keep 2``,
  which fetches each revision when it reads it and evicts all but the last two. A thread samples the cache's bytes
  (the regular files under ``HF_HUB_CACHE``, symlinks not followed: the blobs and partial downloads) every 50 ms;
  the run directory's bytes are read at the end.
* **(b) everything first**: the same import, then one process that downloads every revision's files
  (``huggingface_hub.hf_hub_download``; the tests' hub has no tree route for ``snapshot_download``), then
  ``analyze --run RUN --probe-only`` with ``HF_HUB_OFFLINE=1``.

(a) and (b) alternate, A/B/A/B/A/B over ``--rounds`` rounds; the timed part of each is what follows the import. The
probe's records of the two must be equal.

Targets (issue 73): the peak cache of (a) at most 3 checkpoints' size (plus the run directory, reported beside it);
(a) no slower than (b) (the ratio of their medians <= 1). The hub here is on loopback, without a network's latency or
bandwidth limit. ``analyze`` fetches a revision when its probe step reads it and does not overlap the next fetch
with the analysis, so on a real hub each revision costs its download plus its analysis in either way.

    python bench/hub_series.py [--revisions 50] [--rounds 3]

(``HF_HUB_OFFLINE`` must not be set for the bench itself: its children talk to the loopback hub.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # noqa: E402  (no bar per saved checkpoint)
import torch  # noqa: E402
from record import against, arguments, print_rows, row, save, yes_no  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.sources.hub_server import Hub, serve  # noqa: E402  (the tests' loopback hub)

from plateauscope.analysis.results import load_records, probe_steps_path  # noqa: E402
from plateauscope.runs.files import SERIES_FILE  # noqa: E402

REPO = "EleutherAI/bench-pythia"
VOCAB, WIDTH, LAYERS, HEADS = 4096, 128, 2, 4
KEEP = 2
TARGET_CHECKPOINTS = 3.0
TARGET_RATIO = 1.0
SAMPLE_S = 0.05
FETCH_ALL = ("import sys\nfrom huggingface_hub import hf_hub_download\nfor revision in sys.argv[2:]:\n"
             "    for file in ('config.json', 'model.safetensors'):\n"
             "        hf_hub_download(sys.argv[1], file, revision=revision)")
"""What a user runs to fetch every revision first (``HF_ENDPOINT`` and ``HF_HUB_CACHE`` from the environment)."""


def write_series(out: Path, n: int) -> None:
    """``n`` checkpoints of the model, one optimiser step apart (``checkpoint-{i}/``)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                           intermediate_size=4 * WIDTH, max_position_embeddings=128, hidden_dropout=0.0,
                           attention_dropout=0.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(n):
        model.save_pretrained(out / f"checkpoint-{step}")
        first = torch.randint(1, VOCAB, (16, 16))
        tokens = torch.cat([first, first], 1)
        model(tokens, labels=tokens).loss.backward()
        optimiser.step()
        optimiser.zero_grad()


def tree_bytes(root: Path) -> int:
    """The bytes of the regular files under ``root`` (symlinks neither followed nor counted)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:  # renamed or evicted while walking
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


class Sampler:
    """The peak of :func:`tree_bytes` of a folder, read every :data:`SAMPLE_S` seconds on a thread."""

    def __init__(self, root: Path):
        self.root, self.peak, self.samples = root, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, tree_bytes(self.root))
            self.samples += 1
            self.stop.wait(SAMPLE_S)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, tree_bytes(self.root))


def child(argv: list[str], env: dict[str, str]) -> float:
    """Run one child process to its end; its wall time in seconds (a failure stops the bench with its output)."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])}... exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return took


def plateauscope(*argv: str) -> list[str]:
    return [sys.executable, "-m", "plateauscope", *argv]


def attempt(mode: str, folder: Path, url: str, revisions: list[str]) -> dict:
    """One try of ``mode`` (``a``: just in time, ``b``: everything first) from an empty cache and a new run
    directory: its timed part, its parts, the cache's peak and the run directory's bytes, the probe's records."""
    cache, run = folder / "hub_cache", folder / "run"
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=url, HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_PROGRESS_BARS="1",
               HF_HUB_DISABLE_TELEMETRY="1")
    imported = child(plateauscope("import", f"hf:{REPO}", "--out", str(run), "--no-progress"), env)
    out = {"import_s": imported}
    with Sampler(cache) as sampled:
        if mode == "a":
            out["analyze_s"] = child(plateauscope("analyze", "--run", str(run), "--probe-only", "--keep", str(KEEP),
                                                  "--no-progress"), env)
            out["seconds"] = out["analyze_s"]
        else:
            out["fetch_s"] = child([sys.executable, "-c", FETCH_ALL, REPO, *revisions], env)
            out["analyze_s"] = child(plateauscope("analyze", "--run", str(run), "--probe-only", "--no-progress"),
                                     {**env, "HF_HUB_OFFLINE": "1"})
            out["seconds"] = out["fetch_s"] + out["analyze_s"]
    out.update(peak_cache=sampled.peak, samples=sampled.samples, run_bytes=tree_bytes(run),
               records=load_records(probe_steps_path(run, "induction")))
    out["checkpoint_bytes"] = json.loads((run / SERIES_FILE).read_text())["checkpoints"][0]["size"]
    shutil.rmtree(folder)
    return out


def main() -> int:
    """Build and serve the series, then the rounds of (a) and (b)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--revisions", type=int, default=50, help="step revisions in the series (default 50)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of (a) then (b) (default 3)")
    args = p.parse_args()
    if os.environ.get("HF_HUB_OFFLINE"):
        print("note: HF_HUB_OFFLINE is set here; the children run without it (they need the loopback hub)")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "trainer_out"
        write_series(source, args.revisions)
        hub = Hub()
        revisions = [f"step{i}" for i in range(args.revisions)]
        for i, revision in enumerate(revisions):
            hub.add(REPO, revision, {f: (source / f"checkpoint-{i}" / f).read_bytes()
                                     for f in ("config.json", "model.safetensors")})
        hub.add(REPO, "main", hub.commits[hub.repos[REPO][revisions[-1]]])
        shutil.rmtree(source)
        server = serve(hub)
        tries: dict[str, list[dict]] = {"a": [], "b": []}
        try:
            for r in range(args.rounds):
                for mode in ("a", "b"):
                    done = attempt(mode, Path(tmp) / f"round{r}-{mode}", server.url, revisions)
                    tries[mode].append(done)
                    print(f"round {r + 1} ({mode}): {done['seconds']:.1f} s, peak cache "
                          f"{done['peak_cache'] / 1e6:.1f} MB ({done['samples']} samples)", flush=True)
        finally:
            server.close()
    a, b = tries["a"], tries["b"]
    checkpoint = a[0]["checkpoint_bytes"]
    peak = max(t["peak_cache"] for t in a)
    n = args.revisions
    median = {m: statistics.median(t["seconds"] for t in tries[m]) for m in tries}
    loopback = "over loopback (no network latency)"
    rows = [against(f"analyze --probe-only --keep {KEEP} of a {n}-revision series fetched just in time: peak Hugging "
                    f"Face cache (sampled every {SAMPLE_S * 1000:.0f} ms, highest of {len(a)} runs), in checkpoints' "
                    "size", peak / checkpoint, "checkpoints", "<=", TARGET_CHECKPOINTS),
            row("peak Hugging Face cache, just in time", peak / 1e6, "MB"),
            row("one checkpoint (model.safetensors)", checkpoint / 1e6, "MB"),
            row("the run directory after the probe pass", max(t["run_bytes"] for t in a) / 1e6, "MB"),
            row("peak Hugging Face cache, every revision fetched first, in checkpoints' size",
                max(t["peak_cache"] for t in b) / checkpoint, "checkpoints"),
            against(f"(a) fetch + analyse just in time (--keep {KEEP}) vs (b) fetch all {n} revisions "
                    f"(hf_hub_download) then analyse offline, {loopback}: ratio of the medians of {args.rounds} "
                    "interleaved runs", median["a"] / median["b"], "x", "<=", TARGET_RATIO)]
    for mode, what in (("a", "(a) just in time: analyze --probe-only --keep 2"),
                       ("b", "(b) fetch everything, then analyze --probe-only offline")):
        seconds = [t["seconds"] for t in tries[mode]]
        rows += [row(f"{what}, median", median[mode], "s"), row(f"{what}, fastest", min(seconds), "s"),
                 row(f"{what}, slowest", max(seconds), "s")]
    rows += [row("(b)'s fetch of every revision, median", statistics.median(t["fetch_s"] for t in b), "s"),
             row("(b)'s analyze offline, median", statistics.median(t["analyze_s"] for t in b), "s"),
             row("import hf: (the listing; not timed above), median",
                 statistics.median(t["import_s"] for t in a + b), "s"),
             yes_no("the probe's records of (a) and (b) are equal", all(t["records"] == a[0]["records"]
                                                                        for t in a + b))]
    print_rows(rows)
    print(f"saved {save('hub_series', rows, arguments(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
