"""Benchmark (not a test): ``plateauscope demo`` from scratch, against issue 40's targets.

    .venv/bin/python bench/demo_time.py                  # a fresh demo run in a temporary directory
    .venv/bin/python bench/demo_time.py --log demo.log   # the output of one from this machine

``plateauscope demo`` prints its stage times (``stage times: train N s, analyse N s, ...``) and its
whole time against the target of the host it runs on (``plateauscope.cli.demo.target_seconds``: 5
minutes after the install on an AMD EPYC with AVX-512 and VNNI, 7 on one without AVX-512). This prints
both, and the analysis's share: analyse + report + view over train, against 0.25 (on the same machine,
in the same process). The install is not in the demo's time (``make demo`` prints it apart).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from record import against, arguments, print_rows, row, save

from plateauscope.cli.demo import target_seconds
from plateauscope.runs.machine import describe, machine_record

ANALYSIS_SHARE = 0.25
"""Issue 40: the demo's analyse + report + view at most this fraction of its training time."""
STAGES = re.compile(r"stage times: (.*)$", re.MULTILINE)
STAGE = re.compile(r"(\w+) (\d+) s")
TOTAL = re.compile(r"^demo (\d+) s", re.MULTILINE)


def run_demo() -> str:
    """``plateauscope demo`` into a temporary directory; its output (stdout and stderr)."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "plateauscope", "demo", "--out", str(Path(tmp) / "demo"),
                               "--no-progress"], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"error: plateauscope demo failed (exit {done.returncode}): {done.stderr[-500:]}")
        return done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", type=Path, help="the output of a fresh plateauscope demo on this machine")
    args = p.parse_args(argv)
    if args.log is not None and not args.log.is_file():
        print(f"error: --log {args.log}: no such file", file=sys.stderr)
        return 2
    text = args.log.read_text(errors="replace") if args.log else run_demo()
    stages, total = STAGES.search(text), TOTAL.search(text)
    if stages is None or total is None:
        print(f"error: {args.log or 'plateauscope demo'}: no 'stage times' and 'demo N s' lines (a resumed demo "
              "does not compare its time; run it into a new directory)", file=sys.stderr)
        return 2
    times = {name: float(seconds) for name, seconds in STAGE.findall(stages.group(1))}
    seconds = float(total.group(1))
    machine = machine_record()
    print(describe(machine))
    target = target_seconds(machine)
    rows = [row("demo, wall time after the install", seconds / 60, "min") if target is None else
            against(f"demo, wall time after the install ({target[1]})", seconds / 60, "min", "<=", target[0] / 60)]
    rows += [row(f"demo: {name}", value, "s") for name, value in times.items()]
    share = (times.get("analyse", 0) + times.get("report", 0) + times.get("view", 0)) / times["train"]
    rows.append(against("demo: (analyse + report + view) / train", round(share, 3), "x", "<=", ANALYSIS_SHARE))
    print_rows(rows)
    print(f"saved {save('demo_time', rows, arguments(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
