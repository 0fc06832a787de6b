"""The manual and the README: links that resolve, a CLI reference generated from every parser, an
API reference that lists every module. ``make docs`` (in ``.ci/run``) builds the site in strict mode;
these checks cover what mkdocs does not see (the README) or would not notice (a command or module
left out of the reference)."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "pages"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "docs" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SRC = ROOT / "src"


def _modules(package: str) -> set[str]:
    """Every module of a package, by file (package __init__ and __main__ files excluded)."""
    return {".".join(p.relative_to(SRC).with_suffix("").parts) for p in (SRC / package.replace(".", "/")).rglob("*.py")
            if p.name not in ("__init__.py", "__main__.py")}


@pytest.mark.parametrize("page", ["README.md", "checkpoints/README.md", *[str(p.relative_to(ROOT)) for p in PAGES.rglob("*.md")]])
def test_relative_links_resolve(page):
    path = ROOT / page
    for target in LINK.findall(path.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (path.parent / target).exists(), f"{page}: link to {target} does not resolve"


def test_cli_reference_covers_every_command_and_renders_its_parser():
    ref = _cli_reference()
    page = (PAGES / "reference" / "cli.md").read_text()
    # every module that builds a parser is a verb of the command, and every verb is on the page
    builders = {m for m in _modules("plateauscope") if "def build_parser" in (SRC / (m.replace(".", "/") + ".py")).read_text()}
    assert builders == {ref.verb_module(verb).__name__ for verb in ref.VERBS}
    assert set(ref.MARKER.findall(page)) == {"plateauscope", *ref.VERBS}, "cli.md must have one marker per verb"
    rendered = ref.render(page)
    assert "<!-- cli:" not in rendered
    for verb in ref.VERBS:
        assert f"usage: plateauscope {verb} " in rendered, verb
        assert f"  {verb} " in ref.command_help("plateauscope"), verb
    with pytest.raises(KeyError, match="no verb"):
        ref.command_help("nothing")


def test_api_reference_lists_every_module():
    page = (PAGES / "reference" / "api.md").read_text()
    documented = set(re.findall(r"^::: ([\w.]+)$", page, re.MULTILINE))
    verbs = {_cli_reference().verb_module(verb).__name__ for verb in _cli_reference().VERBS}  # on the CLI page
    text = _modules("plateauscope.cli.text")  # documented as their package, the public plateauscope.text
    packages_with_api = {"plateauscope", "plateauscope.model", "plateauscope.runs", "plateauscope.dynamics",
                         "plateauscope.cli", "plateauscope.cli.text"}
    assert documented == (_modules("plateauscope") - verbs - text) | packages_with_api


def _performance_table():
    spec = importlib.util.spec_from_file_location("performance_table", ROOT / "bench" / "performance_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_performance_table_is_generated_from_the_bench_results():
    """The page's table is exactly what bench/performance_table.py writes from bench/results/*.json."""
    perf = _performance_table()
    page = perf.PAGE.read_text()
    assert perf.render(page) == page, "run bench/performance_table.py"
    for path in sorted(perf.RESULTS.glob("*.json")):
        assert path.stem.split("-")[0] in page, path


def test_the_performance_table_renders_the_newest_value_of_each_target(tmp_path):
    import json

    perf = _performance_table()
    machine = {"cpu": "AMD EPYC", "isa": ["avx2", "avx512f"], "threads": 2, "torch": "2.13.0+cpu", "device": "cpu"}
    older = [{"measure": "ci train, current / abc", "value": 1.2, "unit": "x", "target": "<= 1.05", "met": False}]
    rows = [{"measure": "ci train, current / abc", "value": 1.02, "unit": "x", "target": "<= 1.05", "met": True},
            {"measure": "demo analyse", "value": 1234.5, "unit": "s", "target": None, "met": None}]
    for name, date, commit, rs in (("ab-a.json", "2026-12-01", "0000001", older), ("ab-b.json", "2026-12-03", "abc1234", rows)):
        (tmp_path / name).write_text(json.dumps({"bench": "ab", "commit": commit, "date": date, "machine": machine,
                                                 "rows": rs}))
    page = f"# P\n\n{perf.START}\nold\n{perf.END}\n"
    out = perf.render(page, tmp_path)
    assert "old" not in out and out.count("| `ab` |") == 1  # one row a target; none for a measure without one
    assert "| `ab` | ci train, current / abc | 1.02 x | <= 1.05 | met | EPYC AVX-512, abc1234 |" in out
    # A result with torch's kernels set below the CPU's best (ATEN_CPU_CAPABILITY) is a float path of its own: its
    # rows stand beside the newest native ones, and say so.
    lowered = {**machine, "kernels": "AVX2"}
    (tmp_path / "ab-c.json").write_text(json.dumps({"bench": "ab", "commit": "0000002", "date": "2026-12-02",
                                                    "machine": lowered, "rows": older}))
    out = perf.render(page, tmp_path)
    assert out.count("| `ab` |") == 2 and "| 1.2 x | <= 1.05 | **not met** | EPYC AVX-512, torch kernels AVX2, 0000002 |" in out
    with pytest.raises(ValueError, match="markers"):
        perf.render("# no markers\n", tmp_path)


def test_the_readme_is_a_front_page_of_at_most_800_words():
    assert len((ROOT / "README.md").read_text().split()) <= 800  # what ``wc -w`` counts


MANUAL_WORDS, PERFORMANCE_WORDS = 15_000, 1_800
FAMILY_START, FAMILY_END = "<!-- family-matrix:start -->", "<!-- family-matrix:end -->"


def _words(text: str) -> int:
    """What ``wc -w`` counts: whitespace-separated tokens."""
    return len(text.split())


def _prose(page: Path) -> str:
    """A page without the table that ``bench/performance_table.py`` generates from the bench results: one row
    per measure of every saved result, which grows with the results, not with the manual. What lies between
    the markers is exactly that table (``test_the_performance_table_is_generated_from_the_bench_results``)."""
    text = page.read_text()
    perf = _performance_table()
    for start, end in ((perf.START, perf.END), (FAMILY_START, FAMILY_END)):  # the family matrix likewise
        if start in text:
            head, rest = text.split(start, 1)
            text = head + rest.split(end, 1)[1]
    return text


def test_the_manual_is_one_a_user_reads():
    """The manual (every page under docs/pages) at most 15,000 words, and the Performance page at most 1,800,
    each counted as ``wc -w`` counts, without the generated table of bench results."""
    pages = sorted(PAGES.rglob("*.md"))
    words = {str(p.relative_to(PAGES)): _words(_prose(p)) for p in pages}
    assert sum(words.values()) <= MANUAL_WORDS, words
    assert words["performance.md"] <= PERFORMANCE_WORDS, words["performance.md"]


def test_the_family_matrix_is_generated_from_the_conformance_tests():
    """The manual's family x verb table is what bench/family_matrix.py writes from its saved run of the conformance
    tests, and that run left no cell untested."""
    spec = importlib.util.spec_from_file_location("family_matrix", ROOT / "bench" / "family_matrix.py")
    matrix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(matrix)
    result = json.loads(matrix.RESULT.read_text())
    page = matrix.PAGE.read_text()
    assert matrix.render(page, result) == page, "run bench/family_matrix.py"
    assert result["tests_exit_code"] == 0 and "**untested**" not in page
    from tests.sources.families import FAMILIES

    assert set(result["families"]) == set(FAMILIES)
