"""The paper's noise claims (claim 4) at its scale: the recorded seeds 0 and 1 of ``paper-noise-grid``
with the seeds trained since, read with intervals that have their stated coverage.

    .venv/bin/python bench/noise_claims.py [--sweep sweeps/paper-noise-grid]

Seeds 0 and 1 are read from ``bench/data/paper-noise-grid-seeds-0-1.json`` (their runs were trained
on another machine; the file says where the values come from). Every complete run in ``--sweep``
adds its own seed. The bench prints the readings with seeds 0 and 1 alone and with every seed, the
per-point table, and saves both readings as JSON beside it (``bench/findings/noise-claims-<machine>.json``)
with the machine record of the runs it trained.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from record import commit, machine_slug

from plateauscope.analysis.results import strict_json
from plateauscope.cli.text.dynamics import claim_text, noise_table_text
from plateauscope.dynamics.fits import batch_effect, lr_effect
from plateauscope.dynamics.noise import noise_claims
from plateauscope.dynamics.sweep import load_sweep, tau_key
from plateauscope.runs.files import write_json_atomic
from plateauscope.runs.machine import machine_record
from plateauscope.sweeps.catalogue import get_sweep
from plateauscope.sweeps.spec import expand

RECORDED = Path(__file__).resolve().parent / "data" / "paper-noise-grid-seeds-0-1.json"
FINDINGS = Path(__file__).resolve().parent / "findings"
"""Readings (not timings: ``results/`` feeds the Performance page), one JSON file per machine."""


def recorded_rows(path: Path = RECORDED) -> list[dict]:
    """The recorded seeds as rows of ``plateauscope.dynamics`` (the fields the noise fits read)."""
    data = json.loads(path.read_text())
    point = expand(get_sweep(data["sweep"]))[0].cfg
    tokens = point.task.a_len  # target tokens per example
    rows = []
    for p in data["points"]:
        for seed, value in enumerate(p["values"]):
            tau = None if p.get("censored") else value
            rows.append({"name": f"recorded_bs{p['batch_size']}_lr{p['lr']:g}_seed{seed}", "direction": "backward",
                         "preset": point.preset, "D": point.task.n_b * point.task.K, "K": point.task.K,
                         "lr": p["lr"], "batch_size": p["batch_size"], "seed": seed, "tau": tau, tau_key(0.5): tau,
                         "final_step": value, "tokens_per_step": p["batch_size"] * tokens, "intervention": False})
    return rows


def readings(rows: list[dict]) -> dict:
    """The batch and learning-rate fits at tau (0.5 log K) and the two claims read from them."""
    fits = {"batch": batch_effect(rows), "batch_steps": batch_effect(rows, unit="steps"), "lr": lr_effect(rows)}
    return {"fits": fits, "claims": noise_claims(fits)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, default=Path("sweeps/paper-noise-grid"))
    args = parser.parse_args()
    recorded = recorded_rows()
    trained = [r for r in load_sweep(args.sweep).rows if r["complete"]] if args.sweep.is_dir() else []
    results = {}
    print("tau: geometric mean over seeds [95% t interval from 3 seeds; the range of 2 seeds below 3]; "
          "ratio: of geometric means [Welch's 95% t interval on logs from 3 seeds; the range below]; "
          ">= marks a value or an end from runs stopped before tau")
    for label, rows in (("seeds 0 and 1 (recorded)", recorded), ("every seed", recorded + trained)):
        read = readings(rows)
        results[label] = read
        print(f"\n{label}: {len(rows)} runs")
        print(noise_table_text(read["fits"]))
        for c in read["claims"]:
            print(f"  {claim_text(c)}")
    print(f"\ntrained here: {', '.join(r['name'] for r in trained) or 'none'}")
    machine = machine_record()
    path = FINDINGS / f"noise-claims-{machine_slug(machine)}.json"
    path.parent.mkdir(exist_ok=True)
    write_json_atomic(path, strict_json({"bench": "noise_claims", "commit": commit(), "machine": machine,
                             "recorded": str(RECORDED.name), "trained": [r["name"] for r in trained],
                             "claims": {label: [{k: c[k] for k in ("claim", "verdict", "because", "value", "reference",
                                                                    "ratio", "ci", "bound")}
                                                for c in read["claims"]] for label, read in results.items()}}))
    print(f"saved: {path}")


if __name__ == "__main__":
    main()
