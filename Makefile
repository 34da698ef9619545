# Two commands set everything up: `make train` and `make test`. Both create or refresh .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The torch build to install when .venv has none. GPU users: install the CUDA wheel of their choice
# into .venv first (see README), or e.g. make train TORCH_SPEC="torch==2.13.0 --index-url <your CUDA index>".
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: train test test-fast lint setup clean reliability fuzz-long

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(PY) launch.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

# The inner loop (docs/testing.md): no slow test and no test that starts a Python process.
test-fast: $(STAMP)
	CURRYTRAIN_TEST_TIER=fast $(PY) -m pytest -m "not slow" $(ARGS)

# docs/reliability.md, written by the tests it lists (tests/reliability/table.py), with the logger benchmark's figures
reliability: $(STAMP)
	$(PY) bench/logger_load.py --json docs/reliability.load.json
	CURRYTRAIN_LOAD_TESTS=1 $(PY) -m pytest -p tests.reliability.table tests/reliability tests/test_bad_config.py $(ARGS)

# The config fuzz's long profile (5,000 cases), for a nightly job: its row in docs/reliability.md
fuzz-long: $(STAMP)
	CURRYTRAIN_RELIABILITY_MERGE=1 $(PY) -m pytest -p tests.reliability.table tests/reliability/test_fuzz_config.py --hypothesis-profile=long $(ARGS)

# ruff, then the house's layering (.importlinter; docs/architecture.md)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) runs outputs multirun .pytest_cache
