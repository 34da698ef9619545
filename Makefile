# Two commands set everything up: `make train` and `make test`. Both create or refresh .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The torch build to install when .venv has none. GPU users: install the CUDA wheel of their choice
# into .venv first (see README), or e.g. make train TORCH_SPEC="torch==2.13.0 --index-url <your CUDA index>".
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
ARGS ?=
# make test's pytest workers (pytest-xdist): the suite's processes leave a core idle half the time, so 2 workers
# on 2 cores take about two thirds of one (docs/testing.md). TEST_WORKERS=0 runs it in one process (e.g. for --pdb).
TEST_WORKERS ?= 2

.PHONY: train test test-fast lint setup clean reliability slurm fuzz-long

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(PY) launch.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# The inner loop (docs/testing.md): no slow test and no test that starts a Python process.
test-fast: $(STAMP)
	CURRYTRAIN_TEST_TIER=fast $(PY) -m pytest -m "not slow" $(ARGS)

# docs/reliability.md, written by the tests it lists (tests/reliability/table.py), with the logger benchmark's figures;
# tests/security/ holds its Untrusted artifacts rows
reliability: $(STAMP)
	$(PY) bench/logger_load.py --json docs/reliability.load.json
	CURRYTRAIN_LOAD_TESTS=1 $(PY) -m pytest -p tests.reliability.table tests/reliability tests/security tests/test_bad_config.py $(ARGS)

# The config fuzz's long profile (5,000 cases), for a nightly job: its row in docs/reliability.md
fuzz-long: $(STAMP)
	CURRYTRAIN_RELIABILITY_MERGE=1 $(PY) -m pytest -p tests.reliability.table tests/reliability/test_fuzz_config.py --hypothesis-profile=long $(ARGS)

# SLURM on this machine for tests/test_slurm.py, which starts its own controller and nodes: Debian's slurmctld,
# slurmd, slurm-client and munge, installed with apt-get as root (CI does). Where they cannot be had, those tests
# skip and the summary says why.
SLURM_PACKAGES := slurmctld slurmd slurm-client munge
slurm:
	@missing=""; \
	for b in sbatch squeue sinfo scontrol scancel slurmctld slurmd munged; do \
	  PATH="$$PATH:/usr/sbin" command -v $$b >/dev/null || missing="$$missing $$b"; \
	done; \
	if [ -z "$$missing" ]; then \
	  echo "make slurm: SLURM is installed"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  if timeout 600 apt-get install -y -q $(SLURM_PACKAGES) >/dev/null 2>&1 \
	     || { timeout 300 apt-get update -q >/dev/null && timeout 600 apt-get install -y -q $(SLURM_PACKAGES) >/dev/null; }; then \
	    echo "make slurm: installed $(SLURM_PACKAGES)"; \
	  else \
	    echo "make slurm: apt-get could not install $(SLURM_PACKAGES): tests/test_slurm.py will skip"; \
	  fi; \
	else \
	  echo "make slurm: missing$$missing; install $(SLURM_PACKAGES) (apt-get, as root) or tests/test_slurm.py skips"; \
	fi

# ruff, then the house's layering (.importlinter; docs/architecture.md)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) runs outputs multirun .pytest_cache
