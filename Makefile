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

# Each stage is timed; the times are printed at the end (target: under 5 minutes on 2 cores).
demo:
	@set -e; now() { date +%s.%N; }; t0=$$(now); \
	$(MAKE) --no-print-directory install; t1=$$(now); \
	$(PY) -m training.train --preset demo --out $(DEMO) --resume; t2=$$(now); \
	$(PY) -m interp.analyze --run $(DEMO) --every 2; t3=$$(now); \
	$(PY) -m interp.report --run $(DEMO); t4=$$(now); \
	echo "demo run: $(DEMO) (metrics.jsonl, summary.json, checkpoints/, analysis/)"; \
	echo "report:   $(DEMO)/report.html (open it in a browser; it needs no network)"; \
	awk -v a=$$t0 -v b=$$t1 -v c=$$t2 -v d=$$t3 -v e=$$t4 'BEGIN { \
	  printf "stage times: install %.0f s, train %.0f s, analyse %.0f s, report %.0f s; total %.0f s (%d min %02d s)\n", \
	    b - a, c - b, d - c, e - d, e - a, int((e - a) / 60), int(e - a) % 60 }'

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

clean-venv:
	rm -rf $(VENV)
