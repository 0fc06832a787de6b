# Two commands do all the set-up on a fresh clone:
#   make demo   - virtual environment, install, train the demo run, analyse it, write its report and time view
#   make test   - the same set-up, then the test suite
#   make test-fast - the tests not marked slow (no session training runs, notebooks or browser): seconds
#   make test-tl4 - a second environment, .venv-tl4, with TransformerLens 4.x: the backend tests
#                   (plateauscope.backend) on TransformerBridge
#   make test-wheel - build the wheel, install it (no -e) into a fresh venv, and run the commands from outside the checkout
#   make docs     - the manual (docs/) into build/site, offline, strict: a broken link or reference fails
#   make figures  - the demo's overview figure (written by plateauscope report) into the docs and README
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   := checkpoints/demo

# TransformerLens 4.x cannot share .venv with the 3.x that pyproject.toml pins (same distribution
# name), so it gets its own environment with the project's other runtime and test dependencies.
VENV_TL4 := .venv-tl4
PY_TL4   := $(VENV_TL4)/bin/python
STAMP_TL4 := $(VENV_TL4)/.installed
TL4_DEPS := "transformer-lens>=4.3,<5" "einops>=0.7" "jaxtyping>=0.2.28" "numpy>=1.24" "safetensors>=0.4" \
            "tqdm>=4.66" "scipy>=1.10" "pytest>=8" "beartype>=0.18"
# Each test run opens its series in the other environment too, when that environment exists.
OTHER_OF_MAIN = $(if $(wildcard $(PY_TL4)),$(abspath $(PY_TL4)))
OTHER_OF_TL4  = $(if $(wildcard $(PY)),$(abspath $(PY)))

STAMP_DOCS := $(VENV)/.installed-docs
FIGURE     := docs/pages/images/demo.svg

.PHONY: demo test test-fast test-wheel install install-tl4 test-tl4 docs figures clean-venv

install: $(STAMP)

# torch first, pinned to the CPU build (a bare 'torch' could pull a multi-GB CUDA build).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# The demo: plateauscope demo trains, analyses, and writes the report and the time view (resuming
# what exists); the install and the whole are timed here, the stages by the command itself.
demo:
	@set -e; now() { date +%s.%N; }; t0=$$(now); \
	$(MAKE) --no-print-directory install; t1=$$(now); \
	$(VENV)/bin/plateauscope demo --out $(DEMO); t2=$$(now); \
	awk -v a=$$t0 -v b=$$t1 -v c=$$t2 'BEGIN { printf "install %.0f s, demo %.0f s\n", b - a, c - b }'

test: $(STAMP)
	PLATEAUSCOPE_OTHER_PYTHON=$(OTHER_OF_MAIN) $(PY) -m pytest

install-tl4: $(STAMP_TL4)

# torch first, pinned to the CPU build, exactly as for .venv; then fail if pip swapped in a CUDA build.
$(STAMP_TL4): Makefile pyproject.toml
	test -x $(PY_TL4) || $(PYTHON) -m venv $(VENV_TL4)
	$(PY_TL4) -m pip install -q --upgrade pip
	$(PY_TL4) -m pip install -q "torch==2.13.0"
	$(PY_TL4) -m pip install -q $(TL4_DEPS)
	$(PY_TL4) -m pip install -q --no-deps -e .
	$(PY_TL4) -c "import sys, torch; sys.exit('.venv-tl4: pip installed a CUDA torch' if torch.version.cuda else 0)"
	touch $(STAMP_TL4)

# One torch thread: on this 2-core machine the whole file took 6.8 CPU-minutes on 2 threads, while
# the `ci` run it trains took 56 CPU-seconds on one (the small model gains nothing from a second).
test-tl4: $(STAMP_TL4)
	OMP_NUM_THREADS=1 PLATEAUSCOPE_OTHER_PYTHON=$(OTHER_OF_TL4) $(PY_TL4) -m pytest tests/test_backend.py

test-wheel: $(STAMP)
	$(PY) -m pytest tests/test_wheel.py

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

# The docs extra on top of the project's environment (the two README commands do not need it).
$(STAMP_DOCS): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e ".[dev,docs]"
	touch $(STAMP_DOCS)

docs: $(STAMP_DOCS)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet -f docs/mkdocs.yml
	@echo "manual: build/site/index.html (opens from disk)"

# After make demo: the report writes the run's overview.svg; the README and the docs show the demo's.
figures: demo
	cp $(DEMO)/overview.svg $(FIGURE)
	@echo "$(FIGURE): update the caption under the figure in README.md to its <desc> (tests/test_overview.py checks)"

clean-venv:
	rm -rf $(VENV) $(VENV_TL4)
