"""The manual and the README: links that resolve, a CLI reference generated from every parser, an
API reference that lists every module. ``make docs`` (in ``.ci/run``) builds the site in strict mode;
these checks cover what mkdocs does not see (the README) or would not notice (a command or module
left out of the reference)."""

import importlib.util
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
    assert builders == {f"plateauscope.cli.{verb}" for verb in ref.VERBS}
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
    verbs = {m for m in _modules("plateauscope.cli") if m != "plateauscope.cli.common"}  # on the CLI page
    packages_with_api = {"plateauscope", "plateauscope.dynamics", "plateauscope.cli"}
    assert documented == (_modules("plateauscope") - verbs) | packages_with_api


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


def test_the_performance_table_renders_rows_with_their_machine(tmp_path):
    import json

    perf = _performance_table()
    machine = {"cpu": "Some CPU", "isa": ["avx2"], "threads": 2, "torch": "2.13.0+cpu", "device": "cpu"}
    rows = [{"measure": "ci train, current / abc", "value": 1.02, "unit": "x", "target": "<= 1.05", "met": True},
            {"measure": "demo analyse", "value": 1234.5, "unit": "s", "target": None, "met": None}]
    (tmp_path / "ab-some-cpu.json").write_text(json.dumps({"bench": "ab", "commit": "abc1234", "date": "2026-12-03",
                                                           "machine": machine, "rows": rows}))
    page = f"# P\n\n{perf.START}\nold\n{perf.END}\n"
    out = perf.render(page, tmp_path)
    assert "old" not in out and out.count("| `bench/ab.py` |") == 2
    assert "| 1.02 x | <= 1.05 | met | Some CPU [avx2], 2 threads, torch 2.13.0+cpu | abc1234, 2026-12-03 |" in out
    assert "| 1,234 s |  |  |" in out
    with pytest.raises(ValueError, match="markers"):
        perf.render("# no markers\n", tmp_path)


def test_the_readme_is_a_front_page_of_at_most_800_words():
    assert len((ROOT / "README.md").read_text().split()) <= 800  # what ``wc -w`` counts
