"""Benchmark (not a test): the demo's figures and captions against its own summary (issue 71).

    .venv/bin/python bench/demo_agreement.py                  # a fresh plateauscope demo, then the checks
    .venv/bin/python bench/demo_agreement.py --run DIR        # the checks on a demo run made earlier
    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python bench/demo_agreement.py

Which head the demo names, and when it forms, depends on the float path of the CPU that trains it (an
Intel Ice Lake named no single head where an AMD EPYC named L0H2). Whatever a CPU gives, the run's
report and overview figure must say what its analysis says. This reads the stated routing from
``analysis/routing.json`` (the named head, or the routing group where none is named) and tau from
``summary.json``, then reads the report's text and the figure's caption, legend and drawn elements as
a reader sees them, and checks each statement against those numbers:

* every "routing head L<l>H<h>" in the report and figure names the stated head (none where a group is
  stated), and the figure draws the head (``routing-head``) or the group (``routing-group-mean``);
* every "τ = N" is the summary's tau, and every "halfway up at t_form = N" is the stated t_form;
* the caption names the machine that trained the run (its record in ``summary.json``).

The three environment variables above run torch's, MKL's and oneDNN's kernels as on a CPU without
AVX-512 (the machine record's ``kernels`` says so, and the result is saved apart): a second float
path on the same CPU. The values of the routing rule (margin and interval, t_form, tau) are saved
too, so two machines' results can be set side by side.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from record import arguments, print_rows, row, save, yes_no

from plateauscope.runs.machine import describe, machine_record

SVG = "{http://www.w3.org/2000/svg}"
HEAD_NAMED = re.compile(r"routing head (L\d+H\d+)")
TAU = re.compile(r"τ = (\d+)")
HALFWAY = re.compile(r"halfway up at t_form = (\d+)")


def run_demo(out: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "plateauscope", "demo", "--out", str(out), "--no-progress"],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: plateauscope demo failed (exit {done.returncode}): {done.stderr[-500:]}")


def page_text(page: str) -> str:
    """What a reader of ``page`` reads: scripts and styles dropped, tags removed, entities decoded."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S | re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def checks(run: Path) -> list[dict]:
    """The rows: each statement of the report and figure against the run's routing summary and tau."""
    routing = json.loads((run / "analysis" / "routing.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    group = routing.get("routing_group") if not routing.get("named_head", True) else None
    head = routing.get("label") if routing.get("named_head", True) and routing.get("head") is not None else None
    t_form = routing.get("t_form") if head else (group or {}).get("t_form")
    svg = ET.fromstring((run / "overview.svg").read_text())
    caption = svg.findtext(f"{SVG}desc") or ""
    legend = " ".join(" ".join(t.itertext()) for t in svg.iter(f"{SVG}text"))
    drawn = {e.get("id") for e in svg.iter() if e.get("id")}
    report = page_text((run / "report.html").read_text())
    texts = {"report": report, "figure caption": caption, "figure legend": legend}

    named = {where: set(HEAD_NAMED.findall(text)) for where, text in texts.items()}
    taus = {where: {int(t) for t in TAU.findall(text)} for where, text in texts.items()}
    halfway = {where: {int(t) for t in HALFWAY.findall(text)} for where, text in texts.items()}
    stated = f"routing head {head}" if head else (f"routing group {', '.join(group['labels'])}" if group else "none")
    print(f"{run}: stated {stated}, t_form {t_form}, tau {summary.get('tau')}")
    for where in texts:
        print(f"  {where}: names {sorted(named[where]) or 'no head'}, τ {sorted(taus[where])}, "
              f"t_form {sorted(halfway[where])}")
    machines = summary.get("machines") or []
    margin = routing.get("margin") or {}
    rows = [
        yes_no("summary.json and routing.json: the same tau", summary.get("tau") == routing.get("tau")),
        yes_no("report and figure name as the routing head only the stated one",
               all(found <= ({head} if head else set()) for found in named.values()) and (head is None or head in named["figure caption"])),
        yes_no("the figure draws the stated routing (head, group, or neither)",
               ("routing-head" in drawn) == bool(head) and ("routing-group-mean" in drawn) == bool(group)),
        yes_no("every 'τ = N' in report and figure is the summary's tau",
               all(found <= {summary.get("tau")} for found in taus.values())),
        yes_no("every 'halfway up at t_form = N' is the stated t_form",
               all(found <= ({t_form} if t_form is not None else set()) for found in halfway.values())
               and (t_form is None or t_form in halfway["figure caption"])),
        yes_no("the caption names the machine that trained the run",
               bool(machines) and describe(machines[-1]) in caption),
        row("routing: a single head named (1) or not (0)", float(head is not None), ""),
        row("tau", float(summary["tau"]) if summary.get("tau") is not None else float("nan"), "steps"),
        row("stated t_form", float(t_form) if t_form is not None else float("nan"), "steps"),
    ]
    if margin.get("interval"):
        rows += [row(f"margin {' - '.join(margin['heads'])}", margin["difference"], ""),
                 row("margin: 95% bootstrap interval, low", margin["interval"][0], ""),
                 row("margin: 95% bootstrap interval, high", margin["interval"][1], "")]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, help="a demo run directory made earlier (default: a fresh demo)")
    args = p.parse_args(argv)
    if args.run is not None and not (args.run / "analysis" / "routing.json").is_file():
        print(f"error: --run {args.run}: no analysis/routing.json (not an analysed demo run)", file=sys.stderr)
        return 2
    print(describe(machine_record()))
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run
        if run is None:
            run = Path(tmp) / "demo"
            run_demo(run)
        rows = checks(run)
    print_rows(rows, "{:.4g}")
    print(f"saved {save('demo_agreement', rows, arguments(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
