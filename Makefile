# make eval: set up .venv and run the eval on the embedded default model and data.
# make test: set up .venv and run the whole test suite (slow tests included).
PYTHON ?= python3
# The test extra installs libtpu (TPU compile checks from this host); without a TPU it would print
# start-up warnings, so the targets run JAX on the CPU unless told otherwise (make eval JAX_PLATFORMS=).
JAX_PLATFORMS ?= cpu
export JAX_PLATFORMS
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: eval test test-fast bench clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

eval: $(STAMP)
	$(PY) scripts/eval_rerank.py

test: $(STAMP)
	$(PY) -m pytest -q tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

bench: $(STAMP)
	$(PY) scripts/bench.py

clean:
	rm -rf $(VENV) build *.egg-info
