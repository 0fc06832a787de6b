"""One run's analysis records as text: the routing summary, the circuit and its edges, a patching result,
which signal moved first, the Hessian's geometry and the LLC."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from plateauscope.analysis.ablate import MARGINAL_TOL
from plateauscope.analysis.components import component_label
from plateauscope.analysis.head_llc import STABILITY_FLOOR
from plateauscope.analysis.patch import PatchResult
from plateauscope.analysis.results import median
from plateauscope.analysis.summary import stated_routing
from plateauscope.cli.text.tables import format_table
from plateauscope.model.heads import head_label
from plateauscope.tasks.base import ProgressMeasure
from plateauscope.views.phrases import interval_text, na, named_head_text, plateau_sentence, reads_cue_text, stability


def format_summary(s: dict[str, Any], progress: ProgressMeasure | None = None) -> str:
    """The routing-head summary as text lines (what ``plateauscope analyze`` prints), in the words
    of the task's progress measure (default: the selector task's candidate loss and log K)."""
    label, hl = (progress.label, progress.height_label) if progress else ("candidate loss", "log K")
    lead_bracket = [round(x, 3) for x in s["lead_bracket"]] if s["lead_bracket"] else None
    chance = s.get("chance")
    named = s.get("named_head", True)  # a summary written before the rule named its head
    if not s.get("above_chance", True):
        routing = (f"routing head    none: the best head, {s['label']}, ends at {na(s['final_value'])} attention to the "
                   f"cue, not above chance ({chance:.3f}: uniform over the keys the prediction position can attend to)")
    elif not named:
        routing = f"routing head    {named_head_text(s)}"
    else:
        routing = f"routing head    {named_head_text(s) if 'named_head' in s else s['label']}  (rule: {s['rule']})"
    lines = [routing]
    if s.get("margin"):
        lines.append(f"head rule       {s['margin']['rule']}")
    if named:
        lines += [
            f"attention-to-cue {na(s['start_value'])} at the rules' start (step {s.get('rules_start', s['plateau_start'])})"
            f" -> {na(s['final_value'])} at the end" + (f" (chance {chance:.3f})" if chance is not None else ""),
            f"t_form          {na(s['t_form'], '{}')}  bracket {s['t_form_bracket']}"]
    lines.append(f"tau             {na(s['tau'], '{}')}  bracket {s['tau_bracket']}")
    if named:
        lines.append(f"lead fraction   {na(s['lead_fraction'])}  bracket {lead_bracket}"
                     + ("  (paper: ~0.5)" if hl == "log K" else ""))
    if s.get("plateau_counts"):
        lines.append(f"plateau         {plateau_sentence(s['plateau_counts'], label, hl)}")
    if s.get("release"):
        r = s["release"]
        at = lambda e: f"{e['value']:.3f} (step {e['step']})" if e else "n/a"  # noqa: E731
        lines.append(f"cue released  at step {r['step']}: {label} {at(r['before'])} just before, {at(r['after'])} "
                     f"just after; the t_form rules start at step {s['rules_start']}")
    for name, a in s["ablation"].items():
        if a:
            lines.append(f"ablation {name:<12} step {a['step']:>6}: {label} {a['unablated']:.3f} -> "
                         f"zero {a['zero_ablated']:.3f}, mean {a['mean_ablated']:.3f} ({hl} = {s['height']:.3f})")
    if s["falls_back_to_marginal"] is not None:
        lines.append(f"zero-ablated at the end, the {label} returns to {hl} (within {MARGINAL_TOL:.0%}): "
                     f"{'yes' if s['falls_back_to_marginal'] else 'no'}")
    cue_effect = progress.cue_effect_key if progress and progress.cue_effect_key else "cue effect"
    for rule, r in (s.get("t_form_rules") or {}).items() if named else ():
        lb = [round(x, 3) for x in r["lead_bracket"]] if r["lead_bracket"] else None
        rule = cue_effect if rule == "cue_effect" else rule  # the threshold rule, named by the task's field
        lines.append(f"t_form {rule:<12} {na(r['t_form'], '{}'):>6}  bracket {r['t_form_bracket']}  lead "
                     f"{na(r['lead_fraction'])}  bracket {lb}")
    for name, r in (s.get("attention_rules") or {}).items():
        lines.append(f"{name + ' head':<15} {r['label']}: attention {na(r['start_value'])} -> {na(r['final_value'])}; "
                     f"t_form {na(r['t_form'], '{}')} bracket {r['t_form_bracket']}, lead {na(r['lead_fraction'])}")
    if s.get("smoothing"):
        lines.append(f"smoothing       {s['smoothing']['window']} point(s), {s['smoothing']['kind']}")
    lines += format_circuit(s.get("circuit"), s["height"], s["head"], label, hl)
    damage = (s.get("circuit") or {}).get("damage")
    if damage:
        lines.append(f"damage          each head mean-ablated alone at step {damage['step']} (over every example; "
                     f"not a verdict): " + ", ".join(f"{k} {na(v)}" for k, v in damage["heads"].items())
                     + f"; past 1.25 {hl}: {', '.join(damage['past_height']) or 'none'}")
    stated = stated_routing(s)  # the named head's t_form, or the routing group's; none where neither is stated
    lines += format_edges(s.get("edges"), stated.t_form if stated is not None else None, s["tau"])
    if s["agreement"]:
        rho = [a["spearman"] for a in s["agreement"] if a["spearman"] is not None]
        lines.append(f"attribution vs exact (heads, {len(s['agreement'])} steps): Spearman median "
                     f"{na(median(rho))} (min {na(min(rho) if rho else None)}), "
                     f"max |error| {max(a['max_abs_err'] for a in s['agreement']):.3f} logits")
    return "\n".join(lines)


def format_circuit(c: dict[str, Any] | None, height: float, head: tuple[int, int] | list[int] | None = None,
                   label: str = "candidate loss", height_label: str = "log K") -> list[str]:
    """The circuit summary as text lines (``plateauscope analyze``), in the words of the task's
    progress measure (``label`` against ``height_label``, the value ``height``)."""
    if not c:
        return ["circuit         n/a (no exact-patching steps)"]
    ch = c["chosen"]

    def cl(e: dict[str, Any]) -> str:
        return interval_text(e["progress"], e.get("interval")) + (" (cue lost)" if e.get("loses_cue") else "")

    others = ", ".join(f"{k} {cl(v)}" for k, v in ch["others"].items())
    n80 = c["shares"]["n_for_80"]
    suff = c.get("sufficiency")
    kept = ([f"sufficiency     keeping only {', '.join(suff['kept'])} in {'its' if len(suff['kept']) == 1 else 'their'} "
             f"layer{'' if len(suff['kept']) == 1 else 's'}: {label} {interval_text(suff['progress'], suff.get('interval'))} "
             f"against {na_float(suff['base'])} unablated: "
             + {True: "sufficient", False: "not sufficient", None: "not tested (no other head in their layers)"}[
                 suff["sufficient"]]]
            if suff else [])
    each = c.get("cover_each_alone_suffices") or {}
    return [f"circuit verdict {c['verdict']}" + (f": {', '.join(c['heads'])}" if c["heads"] else "")
            + f"  (step {c['step']}; top head {c['top']} holds {c['top_share']:.0%} of all heads' effect, "
              f"{c['top_layer_share']:.0%} of its layer's; {n80} head{'' if n80 == 1 else 's'} hold{'s' if n80 == 1 else ''} 80%)",
            f"{ch['kind']} ablation  base {cl(ch['base'])}; chosen alone {cl(ch['alone'])}, its layer {cl(ch['layer'])}, "
            f"layer but it {cl(ch['layer_but'])}; others alone: {others}  ({label} [95% t interval over the "
            f"evaluation examples]; {height_label} = {height:.3f}; cue lost: within 25% of {height_label})",
            f"necessary       heads whose ablation alone loses the cue: {', '.join(c['necessary']) or 'none'}; "
            f"the 80% heads ablated together: {interval_text(c['cover_ablated_progress'], c.get('cover_ablated_interval'))}"
            + (f"; each alone keeps the unablated value: {', '.join(k + (' yes' if v else ' no') for k, v in each.items())}"
               if each else "")] + kept + (
        [f"reads the cue   {head_label(*head)} output patched at one position (normalised): {reads_cue_text(c, head)}"]
        if head is not None else [])


def format_edges(s: dict[str, Any] | None, t_form: int | None, tau: int | None) -> list[str]:
    """Text lines of :func:`edges_summary` for ``plateauscope analyze``."""
    if not s:
        return []
    lines = []
    last = s["final_circuit"]
    if last:
        lines.append(f"edge circuit    {last['size']} of {s['n_edges']} edges recover {last['faithfulness']:.2f} of the "
                     f"metric at step {s['final_step']} (target {last['target']}); {stability(s, tau)} "
                     f"(t_form {na(t_form, '{}')}, tau {na(tau, '{}')})"
                     + ("; faithfulness is not monotone in k (fewer edges can reach the target than more)"
                        if last.get("monotone") is False else ""))
        lines.append(f"strongest edges {'; '.join(last['strongest'])}")
    a = s["agreement"]
    if a["steps"]:
        lines.append(f"edge attribution vs exact (top {a['n_edges']} edges, {a['steps']} steps): Spearman median "
                     f"{na(a['spearman_median'])} (min {na(a['spearman_min'])}), max |error| {a['max_abs_err']:.3f} logits")
    b = s.get("sample_agreement") or {}
    if b.get("steps"):
        lines.append(f"edge attribution vs exact ({b['n_edges']} random edges outside the top, {b['steps']} steps from "
                     f"tau/2): Spearman median {na(b['spearman_median'])} (min {na(b['spearman_min'])}), "
                     f"max |error| {b['max_abs_err']:.3f} logits")
    return lines


def _score(res: PatchResult) -> Tensor:
    """What tables show: normalised when the gap can carry shares, else the raw effect in logits."""
    return res.effect if res.gap_problem else res.normalised


def format_result(res: PatchResult, pos_names: list[str], top: int) -> str:
    """A grid (layers x heads / positions) for 2-D results and the top components by |effect|."""

    problem = res.gap_problem
    unit = "raw effect, logits" if problem else "normalised (1 = clean, 0 = corrupted)"
    lines = [f"{res.method} patching of {res.target}, {res.n_pairs} pairs: "
             f"clean metric {res.clean_metric:+.4f}, corrupted {res.corrupt_metric:+.4f}"]
    if problem:
        lines.append(f"warning: {problem}; nothing is normalised by it, raw effects shown")
    score = _score(res)
    if score.dim() == 2:
        cols = [f"H{h}" for h in range(score.shape[1])] if res.axes[1] == "head" else pos_names[: score.shape[1]]
        rows = [[f"L{l}", *map(float, score[l])] for l in range(score.shape[0])]
        lines += ["", f"{unit}:", format_table(rows, ["layer", *cols])]
    flat = score.flatten()
    order = torch.argsort(flat.abs().nan_to_num(-1.0), descending=True)[:top]
    rows = []
    for i in order.tolist():
        idx = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), score.shape))
        rows.append([component_label(res.target, idx, pos_names), float(flat[i]),
                     float(res.raw.flatten()[i])])
    col = "effect (logits)" if problem else "normalised"
    lines += ["", f"top {len(rows)} by |effect|:", format_table(rows, ["component", col, "patched metric"])]
    return "\n".join(lines)


def moved_first_text(result: dict[str, Any]) -> str:
    """The table of :func:`moved_first`: one line per signal in order (then the unread ones, with why),
    then the other rules."""
    rows, order, window = result["signals"], result["order"], result["baseline_window"]
    body = []
    for rank, name in enumerate(order, 1):
        r = rows[name]
        tie = any(rows[o]["step"] == r["step"] for o in order if o != name)
        body.append([f"{rank}{'=' if tie else ''}", name, r["head"] or "", r["step"],
                     f"({r['bracket'][0]}, {r['bracket'][1]}]", f"{r['fraction_of_tau']:.3f}", r["direction"],
                     r["n_baseline"]])
    if result.get("tau_name", "tau") == "tau":
        head = (f"{result['run']}: which signal moved first (tau {result['tau']}; from step {result['start']}"
                f"{' (the cue released)' if result.get('release') else ' (the plateau start)'}, the plateau ending "
                f"at {result['plateau_end']}; band from steps {window[0]}..{window[1]})")
        ratio = "step / tau"
    else:  # an imported run: the probe's loss gap sets the landmarks
        head = (f"{result['run']}: which signal moved first (the probe's phase change at step {result['tau']}; band "
                f"from steps {window[0]}..{window[1]}, the checkpoints before the loss gap's rise)")
        ratio = "step / phase change"
    lines = [head, f"rule: {result['rule_text']}",
             format_table(body, ["rank", "signal", "head", "step", "bracket", ratio, "way", "baseline n"])]
    lines += [f"not read: {name}{' (' + r['head'] + ')' if r['head'] else ''}: {r['note']}"
              for name, r in rows.items() if r["step"] is None]
    lines += [f"note: {n}" for n in result.get("notes", [])]
    if result["alternatives"]:
        lines.append("other rules (each its own; not comparable with the order above):")
        lines.append(format_table(
            [[name, na(a["step"], "{}"), na(a["fraction_of_tau"]), a["rule"]]
             for name, a in result["alternatives"].items()],
            ["rule", "step", "step / tau", "what"]))
    return "\n".join(lines)


def format_record(r: dict[str, Any]) -> str:
    """A readable summary of one checkpoint's geometry."""
    sp, st, nz = r["spectrum"], r["stability"], r["noise"]
    flag = lambda p: "" if p["converged"] else "  FLAGGED"  # noqa: E731
    top = ", ".join(f"{p['value']:.4g}" + ("*" if not p["converged"] else "") for p in sp["top"])
    lines = [f"step {r['step']}: {r['n_params']} parameters, batch {r['batch']}, loss {r['batch_loss']:.4f}, "
             f"|grad| {r['grad_norm']:.4g}, {sp['n_iter']} Lanczos steps, {r['n_hvp']} HVPs, {r['wall_s']:.1f} s",
             f"  top-{len(sp['top'])} eigenvalues: {top}   (* = residual above tol {sp['tol']:g})",
             f"  lambda_max {sp['top'][0]['value']:.5g} (rel residual {sp['top'][0]['rel_residual']:.1e}){flag(sp['top'][0])}"]
    for i, p in enumerate(sp["bottom"]):
        lines.append(f"  bottom[{i}]  {p['value']:+.5g} (residual {p['residual']:.2e}, rel {p['rel_residual']:.1e})"
                     f"{flag(p)}")
    lines += [f"  over {st['n_batches']} Hessian batches (seeds {st['seeds']}): lambda_max {_pm(st['lambda_max'])}; "
              f"lambda_min {_pm(st['lambda_min'])}; lambda_min < 0 in {st['frac_lambda_min_negative']:.0%}"
              f"{'' if st['all_converged'] else '  (some batches FLAGGED)'}"]
    for name, e in r["escape"].items():
        key = f"anisotropy_{name}"
        lines.append(f"  escape {name:<12}: curvature {e['curvature']:+.4g}, anisotropy lambda_max/|curv| "
                     f"{e['anisotropy']:.4g} (batches: {_pm(st[key])}), overlap with top-k {e['overlap_topk']:.3g}")
    lines.append(f"  gradient noise ({nz['n_examples']} examples): share in top-{len(sp['top'])} "
                 f"{nz['share_topk']:.3g} (isotropic {nz['isotropic_topk']:.2g}, x{nz['enrichment_topk']:.3g})"
                 + "".join(f"; along {n} {nz[f'share_{n}']:.3g} (isotropic {nz['isotropic_one']:.2g}, "
                           f"x{nz[f'enrichment_{n}']:.3g})" for n in r["escape"]))
    if r.get("grad_share_topk") is not None:
        lines.append(f"  batch gradient: share in top-{len(sp['top'])} {r['grad_share_topk']:.3g}")
    return "\n".join(lines)


def format_llc_summary(s: dict[str, Any]) -> str:
    """The series summary as a few plain lines."""
    lines = [f"LLC at {len(s['steps'])} checkpoints ({s['steps'][0]}..{s['steps'][-1]}), settings {s['settings']}",
             f"  the loss on {s.get('data', 'the training sequences')}"]
    for name, at in s["at"].items():
        if at:
            lines.append(f"  {name:<14} step {at['step']:>6}: LLC {at['llc']:.2f}")
    lines.append(f"  LLC half-change step {na(s['llc_half_change_step'], '{}')}; t_form {na(s['t_form'], '{}')} "
                 f"({s['routing_head'] or 'no routing.json'}); tau {na(s['tau'], '{}')}")
    lines.append(f"  stationary chains at {sum(s['stationary'])}/{len(s['stationary'])} checkpoints "
                 f"(max |drift| {s['max_abs_drift']:.2f}, allowed {s['settings']['max_drift']})")
    c = s["calibration"]
    if c:
        lines.append(f"  doubled draws at step {c['step']}: LLC {c['llc']:.2f} -> {c['llc_doubled']:.2f} "
                     f"(change {100 * c['rel_change']:.1f}%, allowed {100 * s['settings']['max_rel_change']:.0f}%): "
                     f"{'stable' if c['stable'] else 'NOT stable'}")
    lines.append(f"  wall time {s['seconds']:.1f} s")
    return "\n".join(lines)


def format_head_summary(s: dict[str, Any]) -> str:
    """The per-head summary as a compact table (heads x steps) and a few lines."""
    steps, heads = s["steps"], s["heads"]
    shown = steps if len(steps) <= 8 else [steps[i] for i in np.linspace(0, len(steps) - 1, 8).round().astype(int)]
    idx = [steps.index(x) for x in shown]
    tags = {lab: name for name, lab in s.get("marked", {}).items()}
    lines = [f"per-head LLC ({s['part']}: {', '.join(s['weights'])}) at {len(steps)} checkpoints "
             f"({steps[0]}..{steps[-1]}), {len(heads)} heads; settings {s['settings']}",
             f"{'head':<6}{'cluster':>8}" + "".join(f"{x:>9}" for x in shown) + "  marked"]
    for j, lab in enumerate(heads):
        lines.append(f"{lab:<6}{s['clusters']['cluster'][j]:>8}" + "".join(f"{s['llc'][i][j]:>9.2f}" for i in idx)
                     + (f"  {tags[lab]}" if lab in tags else ""))
    lines.append(f"  stationary chains at {sum(map(sum, s['stationary']))}/{len(steps) * len(heads)} (step, head) "
                 f"pairs (max |drift| {s['max_abs_drift']:.2f}, allowed {s['settings']['max_drift']}); weights "
                 f"outside the head moved by at most {s['frozen_max_change']:g}")
    for c in s["calibration"]:
        worst = int(np.argmax(c["change"]))
        lines.append(f"  doubled draws at step {c['step']}: largest change {100 * c['max_change']:.1f}% "
                     f"({heads[worst]}: {c['llc'][worst]:.2f} -> {c['llc_doubled'][worst]:.2f}; relative to at least "
                     f"{STABILITY_FLOOR}), allowed {100 * s['settings']['max_rel_change']:.0f}%: "
                     f"{'stable' if c['stable'] else 'NOT stable'}")
    cl = s["clusters"]
    lines.append(f"  {cl['n_clusters']} clusters ({cl['method']}): "
                 + "; ".join(f"{i}: {' '.join(m)}" for i, m in cl["members"].items()))
    for name, m in cl["marked"].items():
        lines.append(f"  {name} head {m['head']}: cluster {m['cluster']} ({' '.join(m['cluster_members'])}): "
                     f"{'apart from the other heads' if m['apart'] else 'shared with unmarked heads'}")
    if not cl["marked"]:
        lines.append("  no marked heads (run plateauscope analyze first to mark the routing heads)")
    lines.append(f"  tau {na(s['tau'], '{}')}, t_form {na(s['t_form'], '{}')}; wall time {s['seconds']:.1f} s")
    return "\n".join(lines)


def _pm(s: dict[str, Any], fmt: str = "{:.4g}") -> str:
    if s["mean"] is None:
        return "n/a"
    return f"{fmt.format(s['mean'])} +- {fmt.format(s['std'])} [{fmt.format(s['min'])}, {fmt.format(s['max'])}]"


def na_float(value: float | None) -> str:
    """``value`` to 3 decimals, or n/a."""
    return "n/a" if value is None else f"{value:.3f}"
