# Two commands: `make demo` runs the main job, `make test` runs the tests.
# Each builds .venv on first use (CPU-only torch 2.13.0; never a CUDA build).
# Where the index serves torch as a CUDA build (PyPI on Linux x86_64), point it at a CPU index:
#   make TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_INDEX_URL ?=
# Two pytest workers, one file each at a time (module fixtures stay in one process): CI has 2 cores.
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile
# The tests start many interpreters (the CLI, gloo ranks, Ray workers, servers): each reads the
# byte code compiled at set-up, even where the environment sets PYTHONDONTWRITEBYTECODE.
unexport PYTHONDONTWRITEBYTECODE
# One torch (OpenMP) thread in every interpreter the tests start, as in the workers themselves
# (tests/conftest.py): two workers on two cores, more threads only contend for them.
test test-all: export OMP_NUM_THREADS = 1

.PHONY: demo test test-all lint bench install-matrix clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.version.cuda is None else \
		'torch ' + torch.__version__ + ' is a CUDA build (CUDA ' + torch.version.cuda + '), not the CPU build this set-up needs; ' \
		'rerun with TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu (after rm -rf $(VENV))')"
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m compileall -q distill_guard examples tests benchmarks > /dev/null
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.sdpo_sciknoweval.app

test: $(STAMP)
	$(PYTEST) -m "not slow"

test-all: $(STAMP)  # also the slow variants (about 30 s more)
	$(PYTEST)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/signals.py

install-matrix:  # wheel + sdist into clean venvs, with and without each extra (several minutes)
	scripts/install_matrix.sh

clean:
	rm -rf $(VENV) outputs .pytest_cache
