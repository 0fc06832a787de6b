"""A sweep's records as text: the per-run and per-variant tables, the seeds, the interventions, the LLC
over seeds, the noise claims, and which signal moved first over seeds."""

from __future__ import annotations

from typing import Any

from plateauscope.analysis.formation import RULES
from plateauscope.cli.text.tables import format_table
from plateauscope.dynamics.interventions import EARLY_GIVEN, READOUT_GIVEN, ROUTED_AT_START, compare_to_one
from plateauscope.dynamics.llc import LLC_SD, LOSS_FALL
from plateauscope.dynamics.noise import beyond_text, noise_claims
from plateauscope.views.phrases import TABLE_COLUMNS, na


def variant_table_text(table: list[dict]) -> str:
    """The variant table as aligned text: mean [seed range] per number."""
    def cell(row: dict, key: str, fmt: str) -> str:
        if row[key] is None:
            return "n/a"
        return f"{fmt.format(row[key])} [{fmt.format(row[key + '_lo'])}, {fmt.format(row[key + '_hi'])}]"

    header = ["variant", "model", "verdict", "plateau set loss", "global marginal", "t_marginal", "tau",
              "t_marg/tau", "plateau/tau", "first-token set loss", "(global)", "true marginal",
              "global-marginal stage"]
    body = [[r["variant"], r["model"], r["verdict"], cell(r, "set_loss_plateau", "{:.2f}"),
             cell(r, "global_marginal_set_loss", "{:.2f}"),
             cell(r, "t_marginal", "{:.0f}") + (f" ({r['never_marginal']} never)" if r["never_marginal"] else ""),
             cell(r, "tau", "{:.0f}") + (f" ({r['never_tau']} never)" if r["never_tau"] else ""),
             cell(r, "t_marginal_over_tau", "{:.2f}"), cell(r, "plateau_share", "{:.2f}"),
             cell(r, "first_token_set_loss_plateau", "{:.2f}"),
             cell(r, "global_marginal_first_token", "{:.2f}"),
             "yes" if r["true_marginal"] else "no",
             "no kind" if not r["global_marginal_kind"] else
             f"{'yes' if r['global_marginal_stage'] else 'no'} ({cell(r, 'global_marginal_stage_tau', '{:.2f}')} tau)"]
            for r in table]
    return format_table(body, header)


def seed_lines(s: dict[str, Any] | None) -> list[str]:
    """The seed summary as text lines."""
    if not s:
        return ["seeds: no analysed runs (plateauscope dynamics --sweep DIR --analyze)"]
    lines = [f"over {s['runs']} analysed runs (median lead fraction [interval of the median]):"]
    for rule, d in s["lead"].items():
        ci = f"{d['ci'].text('{:.3f}')} ({d['ci'].label})" if d["ci"] else "(no interval)"
        vals = ", ".join(f"{v:.2f}" for v in d["values"])
        lines.append(f"  lead by {rule:<12} {na(d['median'])} {ci}  n={d['n']}  ({vals})")
    lines.append(f"  routing head in layer 0: {s['layer0']} of {s['runs']}")
    for p in s["per_seed"]:
        lines.append(f"  {p['name']}: seed {p['seed']}, head {p['head']}, circuit {p['verdict'] or 'n/a'}"
                     + (f" ({p['heads']})" if p["heads"] else ""))
    return lines


def table_text(rows: list[dict]) -> str:
    """The per-run table as fixed-width text."""
    def cell(v: Any) -> Any:
        return "-" if v is None else v

    return format_table([[cell(r[k]) for k, _ in TABLE_COLUMNS] for r in rows], [h for _, h in TABLE_COLUMNS])


def intervention_table_text(table: list[dict]) -> str:
    """The table as aligned text."""
    header = ["condition", "seeds", "reached tau", "median S", "(tau - S) / tau_0 [interval] coverage", "per seed",
              "verdicts",
              "start loss / log K", "set loss at S (unmodified)"]
    body = [[r["condition"], f"{r['seeds']}" + (f" ({r['unfinished']} unfinished)" if r["unfinished"] else ""),
             r["reached"], na(r["median_S"], "{:.0f}"), _interval(r),
             " ".join(f"{'>=' if c else ''}{v:.2f}" for v, c in r["wait_ratios"]) or "-",
             ", ".join(f"{k} x{v}" for k, v in r["verdicts"].items()), na(r["start_loss"], "{:.2f}"),
             f"{na(r['set_loss_at_S'], '{:.2f}')} ({na(r['baseline_set_loss_at_S'], '{:.2f}')})"
             if r["set_loss_at_S"] is not None else "-"]
            for r in table]
    return format_table(body, header)


def lead_table_text(table: list[dict]) -> str:
    """Per condition: the median lead from the release by each t_form rule [interval, its coverage], over the analysed
    seeds that had one (their count in brackets after the rule's value); empty when none was analysed."""
    if not any(r[f"lead_{rule}_n"] for r in table for rule in RULES):
        return ""
    header = ["condition", *(f"lead by {rule} [interval] (seeds)" for rule in RULES), "attention at start / final"]
    body = [[r["condition"], *(f"{_lead(r, rule)} ({r[f'lead_{rule}_n']})" for rule in RULES),
             na(r["attention_start"], "{:.2f}")] for r in table]
    return format_table(body, header)


def llc_table_text(rows: list[dict]) -> str:
    """One line per run: the plateau value, t_llc, t_loss, the t_form rules and tau."""
    header = ["run", "seed", "LLC plateau (mean +- sd, n)", "t_llc", "loss fall at t_llc", "t_loss (-5%)",
              *[f"t_form {rule}" for rule in RULES], "tau", "stationary"]
    body = [[r["name"], r["seed"],
             "n/a" if r["baseline_mean"] is None else
             f"{r['baseline_mean']:.2f} +- {r['baseline_sd']:.2f} ({r['baseline_n']})",
             na(r["t_llc"], "{}"), na(r["loss_fall_at_llc"], "{:.1%}"), na(r["t_loss"], "{}"), *[na(r[f"t_form_{rule}"], "{}") for rule in RULES],
             na(r["tau"], "{}"), "yes" if r["all_stationary"] else "no"] for r in rows]
    return format_table(body, header)


def llc_summary_lines(s: dict[str, Any]) -> list[str]:
    """The summary as text: each median with its interval, and the reading."""
    lines = [f"over {s['runs']} runs (median [order-statistic interval of the median, its coverage]; per run):"]
    for what, q in s["quantities"].items():
        ci = f"{q['ci'].text('{:+.3f}')} {q['ci'].label}" if q["ci"] else "(no interval)"
        lines.append(f"  {what:<32} {na(q['median'], '{:+.3f}')} {ci}  ({', '.join(f'{v:+.2f}' for v in q['values'])})")
    lines.append(f"  who moves first is not read: t_llc departs by {LLC_SD:g} sd of the LLC's own noise, t_loss by a "
                 f"fixed {LOSS_FALL:.0%} fall; different rules make a lead close to guaranteed")
    return lines


def over_seeds_text(summary: dict[str, Any]) -> str:
    """The over-seeds table: one line per signal in median order, its interval with the coverage it has,
    each seed's value; then the agreement of each adjacent pair, the signals never read and the skipped runs."""
    signals = summary["signals"]
    body = []
    for rank, name in enumerate(summary["order"], 1):
        s = signals[name]
        ci = s["interval"]
        ways = ", ".join(f"{way} {n}" for way, n in sorted(s["directions"].items()))
        body.append([rank, name, f"{s['median']:.3f}", ci.text("{:.3f}") if ci else "n/a",
                     ci.label if ci else "one seed", f"{s['n']}/{s['n_runs']}", ways,
                     " ".join(f"{v:.2f}" for v in s["values"].values())])
    lines = [f"which signal moved first over {len(summary['runs'])} runs (change point / tau; median, the "
             "order-statistic interval of the median and the coverage it has at that many seeds)",
             f"rule: {summary['rule_text']}",
             format_table(body, ["rank", "signal", "median", "interval", "interval is", "read in", "way", "per seed"])]
    if summary["pairs"]:
        lines.append("adjacent pairs of the median order, seed by seed:")
        lines += [f"  {p['text']}" for p in summary["pairs"]]
    if summary.get("sparse"):
        lines.append("read in fewer than half the runs (left out of the order): " + ", ".join(
            f"{n} ({signals[n]['n']}/{signals[n]['n_runs']}, median {signals[n]['median']:.3f})"
            for n in summary["sparse"]))
    if summary["unread"]:
        lines.append(f"never read (no change point in any run): {', '.join(summary['unread'])}")
    stages = summary.get("stages")
    if stages:
        lines.append(f"the ladder's stages over {stages['n_runs']} runs: on the plateau "
                     + ", ".join(f"{k} in {n}" for k, n in stages["plateau"].items())
                     + "; at the end " + ", ".join(f"{k} in {n}" for k, n in stages["final"].items()))
        lines += [f"  first at {name}: {r['median']:.3f} tau "
                  + (f"{r['interval'].text('{:.3f}')} ({r['interval'].label}), " if r["interval"] else "")
                  + f"in {r['n']} of {stages['n_runs']} runs" for name, r in stages["first_reached"].items()]
    for s in summary["skipped"]:
        lines.append(f"skipped {s['run']}: {s['error']}")
    return "\n".join(lines)


def claim_text(c: dict[str, Any]) -> str:
    """One claim as a line: the ratio with its interval, the verdict and why."""
    if c["ratio"] is None:
        return f"{c['claim']}: {c['verdict']} ({c['because']})"
    ci = f" {c['ci'].text()} ({c['ci'].label})" if c["ci"] else ""
    beyond = "".join(f"; at {u['value']:g}: {beyond_text(u)}" for u in c.get("beyond", []))
    return (f"{c['claim']}: {c['value']:g} against {c['reference']:g}: {c['bound']}{c['ratio']:.2f}x{ci} "
            f"(paper {c['paper']:g}x){beyond}"
            f" - {c['verdict']}: {c['because']}")


def noise_table_text(fits: dict[str, Any]) -> str:
    """Per batch size: tau in steps and in tokens, the tokens' ratio to the largest batch; per learning
    rate: tau in steps and its ratio to the smallest; geometric means over seeds with their intervals."""
    rows = []
    batch, steps, lr = fits.get("batch"), fits.get("batch_steps"), fits.get("lr")
    if batch and steps:
        by_value = {v["value"]: v for v in steps["values"]}
        for v in batch["values"]:
            rows.append([f"batch {v['value']:g}", f"lr {batch['family']['lr']:g}", _seeds(v),
                         _mean(by_value[v["value"]]), _mean(v), f"{_ratio(v)} (vs {batch['reference']:g})"])
    if lr:
        for v in lr["values"]:
            rows.append([f"lr {v['value']:g}", f"batch {lr['family']['batch_size']:g}", _seeds(v), _mean(v), "",
                         f"{_ratio(v)} (vs {lr['reference']:g})"])
    return format_table(rows, ["point", "at", "seeds", "tau (steps)", "tau (tokens)", "ratio"]) if rows else ""


def compare_lines(ours: list[dict], theirs: list[dict], label: str) -> list[str]:
    """Each claim here against the same claim in another sweep (``label``): the same reading or not."""
    lines = []
    for a, b in zip(ours, theirs):
        same = "the same reading" if a["verdict"] == b["verdict"] else "a different reading"
        lines.append(f"  {a['claim']}: here {a['verdict']}"
                     + (f" ({a['bound']}{a['ratio']:.2f}x)" if a["ratio"] is not None else "")
                     + f"; {label}: {b['verdict']}" + (f" ({b['bound']}{b['ratio']:.2f}x)" if b["ratio"] is not None else "")
                     + f" - {same}")
    return lines


def noise_lines(fits: dict[str, Any], compare: tuple[str, dict[str, Any]] | None = None) -> list[str]:
    """The noise table, both claims' readings and (``compare``: a label and another sweep's fits) how
    that sweep reads them."""
    lines = ["gradient noise (geometric mean over seeds [95% t interval from 3 seeds, the range of 2 seeds "
             "below; >= marks an end from runs that never reached tau]):", noise_table_text(fits)]
    claims = noise_claims(fits)
    lines += [claim_text(c) for c in claims]
    if compare:
        label, other = compare
        lines += [f"against {label}:", *compare_lines(claims, noise_claims(other), label)]
    return lines


def _coverage(ci) -> str:
    """How much an interval of a median covers at its n: ``75%``, or ``range`` for 2 seeds."""
    return "range" if ci.coverage is None else f"{100 * ci.coverage:.0f}%"


def _interval(row: dict) -> str:
    ci, ge = row["wait_ratio_ci"], ">=" if row["lower_bound"] else ""
    return f"{ge}{na(row['wait_ratio'], '{:.2f}')}" + (
        f" [{ge}{ci.low:.2f}, {ci.high:.2f}] {_coverage(ci)}" if ci else "")


def _lead(row: dict, rule: str) -> str:
    ci = row[f"lead_{rule}_ci"]
    return na(row[f"lead_{rule}"], "{:.2f}") + (f" {ci.text()} {_coverage(ci)}" if ci else "")


def reading(table: list[dict]) -> list[str]:
    """Plain sentences from the table: what each kind of intervention did to the wait."""
    lines = []
    by = {r["condition"]: r for r in table}
    hidden = [r for r in table if r["condition"].startswith("cue hidden")]
    if hidden:
        kinds = {r["condition"]: compare_to_one(r) for r in hidden}
        text = "; ".join(f"{c}: {_interval(by[c])} ({k})" for c, k in kinds.items())
        if all(k == "same" for k in kinds.values()):
            verdict = ("the wait after the release is about tau_0 whatever came before it: nothing learned "
                       "without the cue shortens it, so the plateau waits for the routing")
        elif all(k == "shorter" for k in kinds.values()):
            verdict = ("the wait after the release is shorter than tau_0: part of the plateau is spent on "
                       "something learnable without the cue")
        elif all(k == "longer" for k in kinds.values()):
            verdict = ("the wait after the release is longer than tau_0: training without the cue does not "
                       "shorten the wait for the routing, it lengthens it")
        else:
            verdict = "the intervals do not agree on one reading"
        lines.append(f"Cue hidden, (tau - S) / tau_0 over seeds: {text}. Reading: {verdict}.")
    given = {c: by[c] for c in (f"{EARLY_GIVEN} (trained)", f"{EARLY_GIVEN} (frozen)", f"{READOUT_GIVEN} (trained)")
             if c in by}
    if given:
        text = "; ".join(f"{c}: tau / tau_0 {_interval(r)}, {r['reached']} of {r['seeds']} seeds reached tau, "
                         f"starting at {na(r['start_loss'], '{:.2f}')} log K" for c, r in given.items())
        routing, readout = given.get(f"{EARLY_GIVEN} (trained)"), given.get(f"{READOUT_GIVEN} (trained)")
        verdict = "the intervals overlap: neither half alone is shown to be the bottleneck"
        if routing and readout and routing["wait_ratio_ci"] and readout["wait_ratio_ci"] and \
                not (routing["lower_bound"] and readout["lower_bound"]):
            if routing["wait_ratio_ci"].high < readout["wait_ratio_ci"].low and not routing["lower_bound"]:
                verdict = ("given the embeddings and layer 0, tau comes sooner than given the readout: the wait is "
                           "in the embeddings and layer 0 (this transplant cannot tell where to look from what is "
                           "carried)")
            elif readout["wait_ratio_ci"].high < routing["wait_ratio_ci"].low and not readout["lower_bound"]:
                verdict = ("given the readout, tau comes sooner than given the embeddings and layer 0: the readout "
                           "is the bottleneck")
        lines.append(f"Transplants: {text}. Reading: {verdict}.")
    routes = [r for r in table if r["condition"].startswith("one route")]
    if routes:
        text = "; ".join(f"{r['condition']}: tau / tau_0 {_interval(r)}, {r['reached']} of {r['seeds']} reached tau"
                         for r in routes)
        lines.append(f"One route in layer 0: {text}.")
    clamped = [r for r in table if " clamped to " in r["condition"] and r["wait_ratio_ci"] and not r["lower_bound"]]
    if clamped:
        text = "; ".join(f"{r['condition']}: tau / tau_0 {_interval(r)} ({compare_to_one(r)})" for r in clamped)
        least = min(r["wait_ratio_ci"].low for r in clamped)
        helped = [r for r in clamped if compare_to_one(r) == "shorter"]
        if least > 1:
            verdict = (f"every clamp lengthens the wait, to at least {least:.2f} tau_0 (the low ends of the "
                       "intervals): where to look, forced from step 0, costs more than it gives")
        elif least > 0.5:
            verdict = (f"every clamp leaves at least {least:.2f} tau_0 of the wait (the low ends of the intervals): "
                       "where to look, given from step 0, is not what most of the plateau waits for"
                       + (f"; it shortens the wait by at most {1 - least:.0%}" if helped else ""))
        elif max(r["wait_ratio_ci"].high for r in clamped) < 0.5:
            verdict = "a clamp leaves less than half the wait: the plateau waits mostly for where to look"
        else:
            verdict = "the intervals do not settle how much of the wait is where to look"
        longer = [r["condition"] for r in clamped if compare_to_one(r) == "longer"]
        if longer and least <= 1:
            verdict += f"; {', '.join(longer)} lengthens it"
        lines.append(f"Attention clamped from step 0: {text}. Reading: {verdict}.")
    analysed = [r for r in table if r["lead_attention_n"] or r["lead_cue_effect_n"]]
    if analysed:
        text = "; ".join(f"{r['condition']}: {na(r['lead_attention'], '{:.2f}')} by attention, "
                         f"{na(r['lead_cue_effect'], '{:.2f}')} by the cue effect" for r in analysed)
        line = f"Lead from the release, (tau - t_form) / (tau - S), medians over the analysed seeds: {text}."
        given = [r for r in analysed if r["condition"].startswith(EARLY_GIVEN) and r["attention_start"] is not None]
        if given:
            starts = "; ".join(f"{r['condition']}: {r['attention_start']:.2f}" for r in given)
            base = f"; unmodified: {na(by['unmodified']['attention_start'], '{:.2f}')}" if "unmodified" in by else ""
            routed = all(r["attention_start"] >= ROUTED_AT_START for r in given)
            line += (f" Attention to z at the plateau start, as a fraction of its final value: {starts}{base}. "
                     + ("Given layer 0, the attention to z is there from step 0, and its t_form times a small rise."
                        if routed else f"Given layer 0, the attention still starts below {ROUTED_AT_START:g} of its "
                        "final value, so its t_form times the routing's formation."))
        lines.append(line)
    return lines


def _mean(v: dict, fmt: str = "{:,.0f}") -> str:
    ci = v["mean_ci"]
    return (">=" if v["censored"] else "") + fmt.format(v["mean"]) + (f" {ci.text(fmt)}" if ci else "")


def _seeds(v: dict) -> str:
    return f"{v['n']}" + (f" ({v['censored']} without tau)" if v["censored"] else "")


def _ratio(v: dict) -> str:
    ci = v["ratio_ci"]
    return f"{v['bound']}{v['ratio']:.2f}" + (f" {ci.text()}" if ci else "")
