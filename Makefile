# Two commands: `make demo` runs the main job, `make test` runs the tests.
# Each builds .venv on first use (CPU-only torch 2.13.0; never a CUDA build).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.sdpo_sciknoweval.app

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow"

test-all: $(STAMP)  # also the slow end-to-end variants (about 20 s more)
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/signals.py

clean:
	rm -rf $(VENV) outputs .pytest_cache
