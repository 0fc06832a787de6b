"""The analysis cache as typed records (``plateauscope.analysis.records``, ``Run.analysis()``) against the
cache's own JSON lines: every number read back is the one written, and nothing is left out."""

import json

import numpy as np

from plateauscope.analysis.records import CACHE_METRIC_NAMES, read_analysis
from plateauscope.analysis.results import ATTENTION_FILE, ROUTING_FILE, analysis_dir


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_typed_records_hold_the_cached_numbers(ci_analysed):
    typed = read_analysis(ci_analysed)
    raw = _lines(analysis_dir(ci_analysed) / ATTENTION_FILE)
    assert typed.steps == sorted(r["step"] for r in raw)
    by_step = {r["step"]: r for r in raw}
    for record in typed.attention:
        written = np.array(by_step[record.step]["to_z_first"], dtype=float)
        assert np.array_equal(record.to_cue, written, equal_nan=True)
        layer, head = np.unravel_index(np.nanargmax(written), written.shape)
        assert record.top_head == (layer, head)
    routing = json.loads((analysis_dir(ci_analysed) / ROUTING_FILE).read_text())
    assert typed.summary.head == tuple(routing["head"]) and typed.summary.tau == routing["tau"]
    assert set(typed.summary.formation) == set(routing["t_form_rules"])
    for ablation in typed.ablation:
        for kind, each in ablation.kinds.items():
            assert set(each.change) == set(CACHE_METRIC_NAMES.values()), kind
            for metric, change in each.change.items():  # the change is the ablated minus the unablated metric
                assert np.allclose(change, each.ablated[metric] - each.base[metric], equal_nan=True, atol=1e-6)
    assert [p.step for p in typed.patching] == sorted(p.step for p in typed.patching)
