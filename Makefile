# Two commands do all the set-up on a fresh clone:
#   make demo   - virtual environment, install, train the demo run, analyse it, write its report and time view
#   make test   - the same set-up, then the test suite
#   make test-fast - the tests not marked slow (no session training runs, notebooks or browser): seconds
#   make test-tl3 - a second environment, .venv-tl3, with TransformerLens 3.x: the tests of everything
#                   that runs differently on HookedTransformer, and the same runs and analyses as on 4.x
#   make test-wheel - build the wheel, install it (no -e) into a fresh venv, and run the commands from outside the checkout
#   make docs     - the manual (docs/) into build/site, offline, strict: a broken link or reference fails
#   make figures  - the demo's overview figure (written by plateauscope report) and its caption into the docs and README
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   := checkpoints/demo

# pyproject.toml accepts TransformerLens 3.5 - 4.x. The project's environment takes 4.x (named, so
# that an environment made when 3.x was the pin moves up); 3.x, the same distribution name, gets its
# own environment with the same dependencies, and auto-circuit (it imports HookedTransformer: 3.x only).
TL_MAIN := "transformer-lens>=4.3,<5"
VENV_TL3 := .venv-tl3
PY_TL3   := $(VENV_TL3)/bin/python
STAMP_TL3 := $(VENV_TL3)/.installed
TL3_TESTS := tests/model/test_backend.py tests/model/test_cross_major.py tests/model/test_fused.py tests/analysis/test_patch.py \
             tests/tasks/test_selector_metrics.py tests/analysis/test_edges.py tests/analysis/test_edges_autocircuit.py tests/training/test_train.py \
             tests/training/test_interventions.py tests/analysis/test_attention_ablate.py tests/sweeps/test_sweep.py
# Each test run trains, resumes and analyses in the other environment too, when that environment exists.
OTHER_OF_MAIN = $(if $(wildcard $(PY_TL3)),$(abspath $(PY_TL3)))
OTHER_OF_TL3  = $(if $(wildcard $(PY)),$(abspath $(PY)))

STAMP_DOCS := $(VENV)/.installed-docs
FIGURE     := docs/pages/images/demo.svg

.PHONY: demo test test-fast test-wheel install install-tl3 test-tl3 docs figures clean-venv

install: $(STAMP)

# torch first, pinned to the CPU build (a bare 'torch' could pull a multi-GB CUDA build).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]" $(TL_MAIN)
	$(PY) -c "import sys, torch; sys.exit('.venv: pip installed a CUDA torch' if torch.version.cuda else 0)"
	touch $(STAMP)

# The demo: plateauscope demo trains, analyses, and writes the report and the time view (resuming
# what exists); the install and the whole are timed here, the stages by the command itself.
demo:
	@set -e; now() { date +%s.%N; }; t0=$$(now); \
	$(MAKE) --no-print-directory install; t1=$$(now); \
	$(VENV)/bin/plateauscope demo --out $(DEMO); t2=$$(now); \
	awk -v a=$$t0 -v b=$$t1 -v c=$$t2 'BEGIN { printf "install %.0f s, demo %.0f s\n", b - a, c - b }'

# The suite on pytest-xdist workers, a test module to each (tests/conftest.py shares the session's runs
# between them and gives each worker its share of the cores' threads).
TEST_WORKERS ?= 2
test: $(STAMP)
	PLATEAUSCOPE_OTHER_PYTHON=$(OTHER_OF_MAIN) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

install-tl3: $(STAMP_TL3)

# torch first, pinned to the CPU build, exactly as for .venv; then fail if pip swapped in a CUDA build.
$(STAMP_TL3): Makefile pyproject.toml
	test -x $(PY_TL3) || $(PYTHON) -m venv $(VENV_TL3)
	$(PY_TL3) -m pip install -q --upgrade pip
	$(PY_TL3) -m pip install -q "torch==2.13.0"
	$(PY_TL3) -m pip install -q -e ".[dev,autocircuit]" "transformer-lens>=3.5,<4"
	$(PY_TL3) -c "import sys, torch; sys.exit('.venv-tl3: pip installed a CUDA torch' if torch.version.cuda else 0)"
	touch $(STAMP_TL3)

test-tl3: $(STAMP_TL3)
	PLATEAUSCOPE_OTHER_PYTHON=$(OTHER_OF_TL3) $(PY_TL3) -m pytest -n $(TEST_WORKERS) --dist loadfile $(TL3_TESTS)

test-wheel: $(STAMP)
	$(PY) -m pytest tests/test_wheel.py

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

# The docs extra on top of the project's environment (the two README commands do not need it).
$(STAMP_DOCS): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e ".[dev,docs]"
	touch $(STAMP_DOCS)

docs: $(STAMP_DOCS)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -f docs/mkdocs.yml
	@echo "manual: build/site/index.html (opens from disk)"

# After make demo: the report writes the run's overview.svg; the README and the docs show the demo's.
figures: demo
	cp $(DEMO)/overview.svg $(FIGURE)
	$(PY) -c 'from pathlib import Path; from plateauscope.views.overview import with_readme_caption as w; \
	  r = Path("README.md"); r.write_text(w(r.read_text(), Path("$(FIGURE)").read_text()))'
	@echo "$(FIGURE) and its caption under the figure in README.md: from the demo run (tests/views/test_overview.py checks)"

clean-venv:
	rm -rf $(VENV) $(VENV_TL3)
