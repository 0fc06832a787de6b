"""What the plateau waits for: the runs of an intervention sweep against each seed's unmodified run.

    plateauscope dynamics --sweep sweeps/plateau-interventions

One row per intervention run (``plateauscope.runs.interventions``), against its baseline, the run of the
same seed without intervention (tau_0, its tau):

* ``S``: the step at which the hidden cue was released (0 for the other interventions);
* ``wait``: tau - S, the steps from the release (or from step 0) to tau; ``wait / tau_0`` compares
  it with the unmodified plateau (1: the same wait; below 1: shorter);
* the plateau (its longest in-band stretch) and verdict of ``summary.json`` and the candidate loss at
  step 0 (where a transplant starts);
* with a hidden cue, the set loss at S (the last evaluation at or before it), and the unmodified
  run's at the same step: what the model learned without the cue;
* where ``plateauscope analyze`` has been run on it (``plateauscope dynamics --sweep DIR
  --analyze``), the lead by each t_form rule of ``plateauscope.analysis.formation``, counted from the release:
  ``(tau - t_form) / (tau - S)``, the selector's lead fraction when S = 0. Every analysis sees a
  checkpoint with the run's interventions as they were at its step, so a hidden cue's t_form
  comes after its release. With the embeddings and layer 0 given, the attention is there at step 0: a
  lead measures only what still rises after it.

Per condition, over seeds: the median of ``wait / tau_0`` with the order-statistic interval of the
median and the coverage it has at that seed count (``plateauscope.analysis.intervals.median_interval``:
75% at 3 seeds, the range of 2 below), how many seeds reached tau, the verdicts, and the median
lead by each rule over the analysed seeds (with its interval). ``with_baselines`` adds the
unmodified runs as a condition of their own (wait 1 by definition), the reference for the leads. A run that did
not reach tau is *censored*: its wait is at least its last step - S (an unfinished run, of a sweep
stopped early, at its last evaluation: counted as ``unfinished``), and that lower bound enters
the median. When a lower bound sits at or below the median, the median (and its interval) is a
lower bound too, printed with ``>=``: it can still show a wait longer than tau_0, never a shorter one.
:func:`reading` turns the intervals into sentences; every number in them comes from the table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plateauscope.analysis.formation import RULES
from plateauscope.analysis.intervals import median_interval
from plateauscope.analysis.results import median, read_routing_summary
from plateauscope.runs import run as rd
from plateauscope.runs.interventions import INTERVENTION_OPTIONS, has_interventions
from plateauscope.runs.metrics import compute_tau

SAME_WAIT = (0.8, 1.25)
"""A wait within this factor of tau_0 reads as "about tau_0" when its interval also holds 1."""
TRANSPLANT_WORDS = {"routing": "embeddings and layer 0", "readout": "readout"}
"""A transplant's condition label names what it gives. ``--transplant routing`` gives the embeddings, layer-0
attention (where to look) and layer-0 values and MLP (what is carried) at once, so its label names the parts,
not "the routing"."""
EARLY_GIVEN, READOUT_GIVEN = (f"{TRANSPLANT_WORDS[t]} given" for t in ("routing", "readout"))
ROUTED_AT_START = 0.9
"""Attention to z at the plateau start at least this fraction of its final value reads as "routed from
step 0": its attention t_form then times a small rise, not the routing's formation."""


def condition_label(options: dict[str, Any]) -> str:
    """The intervention of a sweep point in words (``unmodified`` without one)."""
    if "hide_cue_at" in options:
        return f"cue hidden until {options['hide_cue_at']:g} tau_0"
    if "hide_cue_until" in options:
        return f"cue hidden until step {options['hide_cue_until']}"
    if "transplant" in options:
        given = TRANSPLANT_WORDS.get(options["transplant"], options["transplant"])
        return f"{given} given ({'frozen' if options.get('freeze_transplant') else 'trained'})"
    strength = f" (a = {options.get('clamp_strength', 1.0):g})"
    if options.get("clamp_head_of") == "routing":
        return f"routing head clamped to the cue{strength}"
    if "clamp_head_of" in options:
        return f"top head by {options['clamp_head_of']} attention, clamped to it{strength}"
    if "clamp_layer" in options:
        return f"layer {options['clamp_layer']} clamped to the {options.get('clamp_rule', 'cue')}{strength}"
    if "clamp_heads" in options:
        return f"heads {','.join(options['clamp_heads'])} clamped to the {options.get('clamp_rule', 'cue')}{strength}"
    if "mean_value_heads" in options:
        return f"heads {','.join(options['mean_value_heads'])} mean-valued from step {options.get('ablate_from', 0)}"
    if "frozen_qk_heads" in options:
        return f"heads {','.join(options['frozen_qk_heads'])} QK frozen from step {options.get('ablate_from', 0)}"
    if "only_head" in options:
        return f"one route: only head {options['only_head']}"
    if "masked_heads" in options:
        return f"heads {','.join(options['masked_heads'])} masked"
    return "unmodified"


def _plain(options: dict[str, Any]) -> str:
    """A point's options without its interventions: the key of its baseline run."""
    return json.dumps({k: v for k, v in options.items() if k not in INTERVENTION_OPTIONS}, sort_keys=True)


def _last_before(records: list[dict], step: int, key: str) -> float | None:
    """``key`` at the last evaluation at or before ``step`` that logged it."""
    values = [r[key] for r in records if r["step"] <= step and r.get(key) is not None]
    return values[-1] if values else None


def release_leads(run_dir: Path, tau: int | None, S: int) -> dict[str, float | None]:
    """``lead_<rule>``: (tau - t_form) / (tau - S) by each t_form rule, from the run's analysis (None
    where it was not analysed, or a rule found no t_form); and ``attention_start``: the selector
    head's attention to the cue at the plateau start as a fraction of its final value (near 1 where the
    routing was given: then the attention t_form times a small rise)."""
    rules = (read_routing_summary(run_dir) or {}).get("t_form_rules") or {}
    leads = {}
    for rule in RULES:
        t_form = (rules.get(rule) or {}).get("t_form")
        leads[f"lead_{rule}"] = (tau - t_form) / (tau - S) if tau and t_form is not None and tau > S else None
    attention = rules.get("attention") or {}
    start, final = attention.get("start_value"), attention.get("final_value")
    leads["attention_start"] = start / final if start is not None and final else None
    return leads


def intervention_rows(sweep_dir: str | Path, with_baselines: bool = False) -> list[dict[str, Any]]:
    """One row per trained intervention run of the sweep, against its seed's unmodified run (and,
    ``with_baselines``, one per unmodified run first)."""
    path = Path(sweep_dir)
    points = rd.read_json(path / rd.MANIFEST_FILE).get("points", [])
    baselines = {_plain(p["options"]): p["name"] for p in points if not set(p["options"]) & set(INTERVENTION_OPTIONS)}
    rows = []
    for point in points:
        run_dir, options = path / point["name"], point["options"]
        if not (run_dir / rd.METRICS_FILE).exists():
            continue
        run = rd.Run(run_dir)
        if not has_interventions(run.config.train) and not with_baselines:
            continue
        base_name = baselines.get(_plain(options))
        base_dir = path / str(base_name)
        if base_name is None or not (base_dir / rd.SUMMARY_FILE).exists():
            continue
        summary, tau_0 = run.summary or {}, rd.read_json(base_dir / rd.SUMMARY_FILE).get("tau")
        metrics = run.metrics()
        if not metrics:
            continue
        key = run.progress.key
        start = next((r[key] for r in metrics if r.get(key) is not None), None)
        S = run.config.train.hide_cue_until or 0
        # An unfinished run (a sweep stopped early) counts up to its last evaluation: censored there
        # unless it has reached tau already.
        finished = bool(summary.get("complete"))
        tau = summary.get("tau") if finished else compute_tau(metrics, run.progress)
        last = summary.get("final_step", S) if finished else metrics[-1]["step"]
        if not finished and tau is None and last <= S:  # stopped before its release: no wait to bound
            continue
        wait = (tau if tau is not None else last) - S
        at_S = _last_before(metrics, S, "set_loss")
        base_at_S = _last_before(rd.read_jsonl(base_dir / rd.METRICS_FILE), S, "set_loss")
        rows.append({
            "name": point["name"], "seed": run.config.train.seed, "condition": condition_label(options),
            "tau_0": tau_0, "S": S, "tau": tau, "final_step": last, "finished": finished,
            "censored": tau is None,
            "wait": wait, "wait_ratio": wait / tau_0 if tau_0 else None,
            "plateau_stretch": run.plateau_stretch(), "verdict": (run.plateau() or {}).get("verdict"),
            "start_loss_over_height": start / run.progress.height if start is not None else None,
            "set_loss_at_S": at_S if S else None, "baseline_set_loss_at_S": base_at_S if S else None,
            **release_leads(run_dir, tau, S),
        })
    return sorted(rows, key=lambda r: r["condition"] != "unmodified")  # stable: the sweep's order otherwise


def intervention_table(rows: list[dict]) -> list[dict[str, Any]]:
    """Per condition (in the sweep's order): seeds, how many reached tau, the median wait / tau_0 with
    its order-statistic interval and the per-seed values, the verdicts and the median starting loss."""
    out = []
    for condition in dict.fromkeys(r["condition"] for r in rows):
        rs = [r for r in rows if r["condition"] == condition]
        values = sorted((r["wait_ratio"], r["censored"]) for r in rs if r["wait_ratio"] is not None)
        ratios = [v for v, _ in values]
        mid = median(ratios)
        verdicts: dict[str, int] = {}
        for r in rs:
            verdicts[r["verdict"] or "none"] = verdicts.get(r["verdict"] or "none", 0) + 1
        out.append({"condition": condition, "seeds": len(rs), "reached": sum(not r["censored"] for r in rs),
                    "unfinished": sum(not r.get("finished", True) for r in rs),
                    "median_S": median([r["S"] for r in rs]), "wait_ratio": mid,
                    "lower_bound": any(c and v <= mid for v, c in values),
                    "wait_ratio_ci": median_interval(ratios), "wait_ratios": values,
                    "verdicts": verdicts,
                    "start_loss": median([r["start_loss_over_height"] for r in rs
                                          if r["start_loss_over_height"] is not None]),
                    "set_loss_at_S": median([r["set_loss_at_S"] for r in rs if r["set_loss_at_S"] is not None]),
                    "baseline_set_loss_at_S": median([r["baseline_set_loss_at_S"] for r in rs
                                                      if r["baseline_set_loss_at_S"] is not None]),
                    **_lead_summary(rs)})
    return out


def _lead_summary(rs: list[dict]) -> dict[str, Any]:
    """Per rule: the median lead over the analysed runs of ``rs``, its interval and how many had one."""
    out: dict[str, Any] = {}
    for rule in RULES:
        leads = [r[f"lead_{rule}"] for r in rs if r.get(f"lead_{rule}") is not None]
        out[f"lead_{rule}"] = median(leads)
        out[f"lead_{rule}_ci"] = median_interval(leads)
        out[f"lead_{rule}_n"] = len(leads)
    out["attention_start"] = median([r["attention_start"] for r in rs if r.get("attention_start") is not None])
    return out


def compare_to_one(row: dict) -> str:
    """``same``, ``shorter``, ``longer`` or ``unclear`` for a condition's wait against tau_0."""
    ci = row["wait_ratio_ci"]
    if row["wait_ratio"] is None or ci is None:
        return "unclear"
    if row["lower_bound"]:  # only "longer" survives a lower bound
        return "longer" if ci.low > 1 else "unclear"
    if ci.high < 1:
        return "shorter"
    if ci.low > 1:
        return "longer"
    return "same" if SAME_WAIT[0] <= row["wait_ratio"] <= SAME_WAIT[1] else "unclear"
