"""Fault trials (not a test): each fault done to a real run, what the user sees, and what is kept.

    .venv/bin/python bench/faults.py [--preset tiny] [--write-docs]

Trains the preset once straight through as the reference, then for each fault starts again in a
fresh directory, does the fault, reruns the same command, and checks what is left against the
reference: checkpoints byte-identical, metrics and analysis records equal, every file verifying
against ``checksums.json``. The kills are real ``kill -9`` of a ``plateauscope`` process at a
random moment (seeded) of its work. Prints the table; ``--write-docs`` also writes it into
``docs/pages/run-directory.md`` between its ``fault-table`` markers. Each row is saved as a check
(1: the outcome held) in ``bench/results/faults-<machine>.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

from record import arguments, save, yes_no  # noqa: E402

from plateauscope.analysis.results import ANALYSIS_DIR, LOCK_FILE, VIEW_FILE  # noqa: E402
from plateauscope.runs import files  # noqa: E402
from plateauscope.runs import run as rd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests import slurm_cluster  # noqa: E402  (the tests' one-node cluster)

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "pages" / "run-directory.md"
START, END = "<!-- fault-table:start -->", "<!-- fault-table:end -->"
ANALYSE = ["--n-examples", "16", "--n-exact", "2", "--no-progress"]


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "plateauscope", *args]


def run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True)


def killed(args: list[str], after: float) -> None:
    """Start ``args`` and ``kill -9`` it ``after`` seconds in (if it is still running)."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(after)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


def same_checkpoints(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in (a / rd.CHECKPOINT_DIR).iterdir())
    return names == sorted(p.name for p in (b / rd.CHECKPOINT_DIR).iterdir()) and all(
        (a / rd.CHECKPOINT_DIR / n).read_bytes() == (b / rd.CHECKPOINT_DIR / n).read_bytes() for n in names)


def same_metrics(a: Path, b: Path) -> bool:
    def strip(run: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in rd.read_jsonl(run / rd.METRICS_FILE)]
    return strip(a) == strip(b)


def cache(run_dir: Path) -> dict[str, list]:
    return {p.name: sorted((r["step"], repr(r)) for r in rd.read_jsonl(p)) for p in (run_dir / ANALYSIS_DIR).glob("*.jsonl")}


def last_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else "(nothing)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", help="run to train (default tiny: seconds a trial)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    p.add_argument("--write-docs", action="store_true", help=f"write the table into {PAGE.relative_to(ROOT)}")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="faults-"))
    train = ["train", "--preset", args.preset, "--no-progress"]
    straight = work / "straight"
    t0 = time.perf_counter()
    assert run(command(*train, "--out", str(straight))).returncode == 0
    train_s = time.perf_counter() - t0
    assert run(command("analyze", "--run", str(straight), *ANALYSE)).returncode == 0
    reference_cache = cache(straight)
    rows: list[tuple[str, str, str, bool]] = []  # fault, what the user sees, what is kept, held

    # kill -9 during training, then the same command with --resume
    out = work / "train_killed"
    killed(command(*train, "--out", str(out)), after=rng.uniform(0.4, 0.9) * train_s)
    resumed = run(command(*train, "--out", str(out), "--resume"))
    ok = resumed.returncode == 0 and same_checkpoints(out, straight) and same_metrics(out, straight) \
        and files.verify_run(out) == []
    rows.append(("`kill -9` during `train`", "nothing; `train --resume` continues from the last resume state",
                 "every checkpoint byte-identical to an uninterrupted run's; metrics equal; all files verify", ok))

    # kill -9 during analyze, then analyze again
    out = work / "analyze_killed"
    shutil.copytree(straight, out, ignore=shutil.ignore_patterns(ANALYSIS_DIR))
    t0 = time.perf_counter()
    assert run(command("analyze", "--run", str(straight), *ANALYSE)).returncode == 0  # all cached: import time
    killed(command("analyze", "--run", str(out), *ANALYSE), after=time.perf_counter() - t0 + rng.uniform(0.3, 1.5))
    again = run(command("analyze", "--run", str(out), *ANALYSE))
    ok = again.returncode == 0 and cache(out) == reference_cache
    rows.append(("`kill -9` during `analyze`", "nothing; `analyze` again computes only what is missing",
                 "every cache record complete; after the rerun, the same records as one uninterrupted analysis", ok))

    # kill -9 during a follow, while training runs beside it; then follow again
    out = work / "follow_killed"
    trainer = subprocess.Popen(command(*train, "--out", str(out)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed(command("analyze", "--run", str(out), "--follow", "--poll", "0.2", *ANALYSE),
           after=rng.uniform(0.5, 0.9) * train_s)
    trainer.wait()
    again = run(command("analyze", "--run", str(out), "--follow", *ANALYSE))
    ok = again.returncode == 0 and cache(out) == reference_cache and 'id="live-status"' not in (out / "report.html").read_text()
    if not ok:
        print(f"follow: rc {again.returncode}, {last_line(again)}; cache equal {cache(out) == reference_cache}; "
              f"{ {k: (len(v), len(reference_cache.get(k, []))) for k, v in cache(out).items()} }", file=sys.stderr)
    rows.append(("`kill -9` during `analyze --follow`", "nothing; following again finishes the analysis",
                 "every cache record complete; after the rerun, the same records as an analysis after the fact", ok))

    # kill -9 of the sweep's own process while its jobs run on Slurm; then the same command
    if not slurm_cluster.missing():
        folder = work / "cluster"
        env = {**os.environ, **slurm_cluster.start(folder)}
        try:
            sweep = [sys.executable, "-m", "plateauscope", "sweep", "--preset", "tiny", "--executor", "slurm",
                     "--threads", "1", "--no-progress", "--out", str(work / "sweep")]
            client = subprocess.Popen(sweep, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            time.sleep(rng.uniform(4.0, 8.0))
            client.send_signal(signal.SIGKILL)
            client.wait()
            again = subprocess.run(sweep, capture_output=True, text=True, env=env)
            serial = subprocess.run(sweep[:7] + ["serial"] + sweep[8:-1] + [str(work / "serial")], capture_output=True,
                                    text=True)
            names = sorted(p.name for p in (work / "serial").iterdir() if (p / rd.CONFIG_FILE).exists())
            ok = again.returncode == 0 and serial.returncode == 0 and all(
                same_checkpoints(work / "sweep" / n, work / "serial" / n) for n in names)
            rows.append(("`kill -9` of `sweep --executor slurm` while its array runs",
                         "nothing; the same command again waits for the array, or resubmits what did not finish",
                         f"every run complete and byte-identical to a serial sweep's "
                         f"(`{re.search(r'[0-9]+ of [0-9]+ runs complete', again.stdout).group()}`)", ok))
        finally:
            slurm_cluster.stop(folder)

    # kill -9 during the view build
    out = work / "view_killed"
    shutil.copytree(straight, out)
    t0 = time.perf_counter()
    assert run(command("view", "--run", str(out))).returncode == 0
    view_s = time.perf_counter() - t0
    first = (out / VIEW_FILE).read_bytes()
    killed(command("view", "--run", str(out)), after=rng.uniform(0.5, 0.95) * view_s)
    ok = (out / VIEW_FILE).read_bytes() == first and run(command("view", "--run", str(out))).returncode == 0
    rows.append(("`kill -9` during `view`", "nothing", "the previous `view.html`, whole (a hidden `.tmp` file may "
                 "remain beside it)", ok))

    # the analysis lock held by a process that was killed
    out = work / "dead_lock"
    shutil.copytree(straight, out, ignore=shutil.ignore_patterns(ANALYSIS_DIR))
    (out / ANALYSIS_DIR).mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
                               "os.write(fd, b'pid %d' % os.getpid())\nprint('held', flush=True)\ntime.sleep(600)",
                               str(out / ANALYSIS_DIR / LOCK_FILE)], stdout=subprocess.PIPE, text=True)
    holder.stdout.readline()
    held = run(command("analyze", "--run", str(out), "--no-wait", *ANALYSE))
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    after = run(command("analyze", "--run", str(out), "--no-wait", *ANALYSE))
    ok = held.returncode == 2 and after.returncode == 0 and cache(out) == reference_cache
    rows.append(("the analysis lock held by a live process, then by one killed with `kill -9`",
                 f"live: `{last_line(held).replace(str(work) + '/', '')}` (without `--no-wait`: one line, then it waits)",
                 "killed: nothing; the kernel released its lock, and the next analysis runs", ok))

    # checkpoint faults
    for fault in ("truncated", "one byte flipped", "missing"):
        out = work / fault.replace(" ", "_")
        shutil.copytree(straight, out)
        ckpts = sorted((out / rd.CHECKPOINT_DIR).iterdir())
        path = ckpts[len(ckpts) // 2]
        data = bytearray(path.read_bytes())
        if fault == "truncated":
            path.write_bytes(bytes(data[: len(data) // 2]))
        elif fault == "missing":
            path.unlink()
        else:
            data[-7] ^= 0x01
            path.write_bytes(bytes(data))
        verify = run(command("verify", str(out)))
        step = int(path.stem.split("_")[1])
        patched = run(command("patch", "--ckpt", str(out), "--step", str(step), "--n-examples", "16"))
        ok = verify.returncode == 1 and patched.returncode == 2 and str(path) in patched.stderr
        rows.append((f"a checkpoint {fault}", f"`verify`: `{verify.stdout.splitlines()[0].replace(str(work) + '/', '')}`;"
                     f" loading it: `{last_line(patched).replace(str(work) + '/', '')}`",
                     "every other file; `verify` exits 1", ok))

    # a bad resume state (of the finished run: the one before it is at an earlier step)
    out = work / "bad_resume"
    shutil.copytree(straight, out, ignore=shutil.ignore_patterns(ANALYSIS_DIR))
    state = out / rd.RESUME_FILE
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01
    state.write_bytes(bytes(data))
    refused = run(command(*train, "--out", str(out), "--resume"))
    state.unlink()
    resumed = run(command(*train, "--out", str(out), "--resume"))
    ok = refused.returncode == 2 and "refusing to resume" in refused.stderr and resumed.returncode == 0 \
        and same_checkpoints(out, straight)
    rows.append(("a resume state altered", f"`{last_line(refused).replace(str(work) + '/', '')}`",
                 "every file; after deleting it as the line says, the run resumes and ends byte-identical", ok))

    # a full disk (a real tmpfs where the machine allows mounting one)
    mount = work / "small"
    mount.mkdir()
    if os.geteuid() == 0 and run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)]).returncode == 0:
        try:
            out = mount / "run"
            full = run(command(*train, "--out", str(out)))
            intact = files.verify_run(out) == []
            run(["mount", "-o", "remount,size=64m", str(mount)])
            resumed = run(command(*train, "--out", str(out), "--resume"))
            ok = full.returncode == 2 and intact and resumed.returncode == 0 and same_checkpoints(out, straight)
            rows.append(("the disk fills during `train` (a 512 kB tmpfs)",
                         f"`{last_line(full).replace(str(work) + '/', '')}`",
                         "every file complete or absent, all verify; with space freed, `--resume` ends byte-identical",
                         ok))
        finally:
            run(["umount", "-l", str(mount)])
    shutil.rmtree(work, ignore_errors=True)

    lines = ["| fault | what the user sees | what is kept | held |", "| --- | --- | --- | --- |"]
    lines += [f"| {f} | {sees} | {kept} | {'yes' if ok else '**no**'} |" for f, sees, kept, ok in rows]
    table = "\n".join(lines)
    print(table)
    print(f"saved {save('faults', [yes_no(f, ok) for f, _, _, ok in rows], arguments(args))}")
    if args.write_docs:
        page = PAGE.read_text()
        head, rest = page.split(START, 1)
        PAGE.write_text(f"{head}{START}\n{table}\n{END}{rest.split(END, 1)[1]}")
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
