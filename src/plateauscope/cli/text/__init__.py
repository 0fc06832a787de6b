"""Records rendered as text for the command line (and for notebooks, as ``plateauscope.text``): tables,
the routing summary, and the per-analysis and per-sweep renderers. The analyses return records; only
this package and the pages (:mod:`plateauscope.views`) turn them into words."""

from plateauscope.cli.text.analysis import (
    format_circuit,
    format_edges,
    format_head_summary,
    format_llc_summary,
    format_record,
    format_result,
    format_summary,
    moved_first_text,
)
from plateauscope.cli.text.dynamics import (
    claim_text,
    intervention_table_text,
    lead_table_text,
    llc_summary_lines,
    llc_table_text,
    noise_lines,
    noise_table_text,
    over_seeds_text,
    reading,
    seed_lines,
    table_text,
    variant_table_text,
)
from plateauscope.cli.text.tables import format_table
from plateauscope.views.phrases import (
    direction_text,
    effect_text,
    fit_text,
    interval_text,
    na,
    reads_cue_text,
    stability,
    summary_lines,
)

__all__ = [
    "claim_text", "direction_text", "effect_text", "fit_text", "format_circuit", "format_edges",
    "format_head_summary", "format_llc_summary", "format_record", "format_result", "format_summary", "format_table",
    "intervention_table_text", "interval_text", "lead_table_text", "llc_summary_lines", "llc_table_text", "moved_first_text",
    "na", "noise_lines", "noise_table_text", "over_seeds_text", "reading", "reads_cue_text", "seed_lines", "stability",
    "summary_lines", "table_text", "variant_table_text",
]
