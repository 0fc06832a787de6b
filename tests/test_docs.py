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


def _modules(package: str) -> set[str]:
    """Every module of a package, by file (package __init__ and __main__ files excluded)."""
    return {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / package).rglob("*.py")
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
    assert set(ref.MARKER.findall(page)) == set(ref.COMMANDS), "cli.md must have one marker per command"
    # every module that builds a parser is a command of the reference
    builders = {m for m in _modules("training") | _modules("interp")
                if "def build_parser" in (ROOT / (m.replace(".", "/") + ".py")).read_text()}
    assert builders == set(ref.COMMANDS.values())
    rendered = ref.render(page)
    assert "<!-- cli:" not in rendered
    for command in ref.COMMANDS:
        assert f"usage: python -m {command} " in rendered, command
    with pytest.raises(KeyError, match="no command"):
        ref.command_help("interp.nothing")


def test_api_reference_lists_every_module():
    page = (PAGES / "reference" / "api.md").read_text()
    documented = set(re.findall(r"^::: ([\w.]+)$", page, re.MULTILINE))
    thin_wrappers = {"interp.report"}  # `python -m interp.report` runs interp.views.report
    assert documented == (_modules("training") | _modules("interp")) - thin_wrappers | {"interp.dynamics"}
