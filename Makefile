# Two commands do all the set-up on a fresh clone:
#   make demo   - virtual environment, install, train the demo run, analyse it, write its report
#   make test   - the same set-up, then the test suite
#   make test-fast - the tests not marked slow (no session training runs, notebooks or browser): seconds
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   := checkpoints/demo

.PHONY: demo test test-fast install clean-venv

install: $(STAMP)

# torch first, pinned to the CPU build (a bare 'torch' could pull a multi-GB CUDA build).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m training.train --preset demo --out $(DEMO) --resume
	$(PY) -m interp.analyze --run $(DEMO) --every 2
	$(PY) -m interp.report --run $(DEMO)
	@echo "demo run: $(DEMO) (metrics.jsonl, summary.json, checkpoints/, analysis/)"
	@echo "report:   $(DEMO)/report.html (open it in a browser; it needs no network)"

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

clean-venv:
	rm -rf $(VENV)
