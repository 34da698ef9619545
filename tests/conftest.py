"""Shared fixtures: compose the real root config (tiny sizes) and run launch.py as a user would."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hypothesis import HealthCheck, Phase, settings

from currytrain.config import register_configs
from currytrain.workers import available_cores

ROOT = Path(__file__).resolve().parents[1]
FUZZ_CASES = int(os.environ.get("CURRYTRAIN_FUZZ_CASES", "500"))
"""Cases of the config fuzz test in `make test` (the `ci` hypothesis profile)."""
CONF = ROOT / "conf"

# Hypothesis profiles (tests/reliability/test_fuzz_config.py): `ci`, the default, derandomised so that every run of
# `make test` draws the same cases; `long` (--hypothesis-profile=long) for a nightly job.
# No shrinking: a failing case is printed as drawn (shrinking re-composes configs for minutes).
FUZZ_SETTINGS = {"derandomize": True, "deadline": None, "database": None, "suppress_health_check": list(HealthCheck), "phases": [Phase.generate]}
settings.register_profile("ci", max_examples=FUZZ_CASES, **FUZZ_SETTINGS)
settings.register_profile("long", max_examples=5000, **FUZZ_SETTINGS)
settings.load_profile("ci")

# `make test` runs 2 pytest-xdist workers (docs/testing.md). Each gets its share of the cores for its in-process runs
# and the processes it starts (OMP_NUM_THREADS), as curryTrain's own workers do (currytrain.workers.worker_threads):
# with two threads per pytest worker on 2 cores, OpenMP threads spin on cores the other worker holds.
XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if XDIST_WORKERS > 1:
    _share = max(1, available_cores() // XDIST_WORKERS)
    os.environ["OMP_NUM_THREADS"] = str(_share)
    torch.set_num_threads(_share)

# Small enough that a run of a few steps takes about a second on one CPU core.
TINY = [
    "model.dim=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.n_kv_heads=1",
    "model.mlp_hidden=64",
    "model.max_seq_len=32",
    "trainer.batch_size=4",
    "trainer.max_steps=6",
    "trainer.eval_every=3",
    "trainer.eval_batches=2",
    "trainer.log_every=1",
    "trainer.progress=false",
    "optimizer.schedule.warmup_steps=2",
]


@pytest.fixture(autouse=True)
def checkout_imports():
    """After each test, `experiments` is the checkout's again: a `currytrain` command run in-process inside a
    project's folder puts that project first on sys.path (currytrain.conf.enter_app), as it should for a process."""
    saved_path = sys.path[:]
    saved = {name: module for name, module in sys.modules.items() if name == "experiments" or name.startswith("experiments.")}
    yield
    if sys.path != saved_path:
        sys.path[:] = saved_path
        for name in [name for name in sys.modules if name == "experiments" or name.startswith("experiments.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def compose_tiny(*overrides: str, tiny: bool = True):
    """The composed root config, TINY overrides applied first (module-scoped fixtures call it directly)."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[*(TINY if tiny else []), *overrides])


@pytest.fixture
def compose_cfg():
    """compose_cfg(*overrides) -> the composed root config, TINY overrides applied first."""
    yield compose_tiny
    GlobalHydra.instance().clear()


def launch_argv(overrides: tuple[str, ...], tiny: bool) -> list[str]:
    """launch.py's arguments: flags (-m, --cfg job) first, then TINY, then the overrides."""
    flags = [arg for arg in overrides if arg.startswith("-")]  # -m etc. must precede the overrides
    values = [arg for arg in overrides if not arg.startswith("-")]
    return [*flags, *(TINY if tiny else []), *values]


def launch_subprocess(*overrides: str, tiny: bool = True, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python launch.py ...` in a subprocess, as a user would (`env` adds environment variables). For what only
    a process shows: its start-up, signals, a kill, workers it starts, output written by native code."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    args = [sys.executable, str(ROOT / "launch.py"), *launch_argv(overrides, tiny)]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def needs_process(argv: list[str], env: dict[str, str] | None) -> bool:
    """Runs the in-process runner leaves to a subprocess: several workers (their output is the workers'
    processes', not this one's), multiruns (launchers and sweepers own their processes), a changed environment
    (read at import time by libraries already imported here)."""
    nproc = [arg.split("=", 1)[1] for arg in argv if arg.startswith("parallel.nproc=")]
    if os.environ.get("CURRYTRAIN_TEST_SUBPROCESS") == "1":  # every run in its own process, as before the runner
        return True
    return bool(env) or "-m" in argv or "--multirun" in argv or any(not value.isdigit() or int(value) > 1 for value in nproc)


def train_losses(run_dir: Path) -> list[float]:
    """The train/loss of each step a run logged (its metrics.jsonl), in order."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["train/loss"] for row in rows if "train/loss" in row]


def launch(*overrides: str, tiny: bool = True, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python launch.py ...` as a user types it, with its exit code, stdout and stderr; run inside this test
    process (tests.inprocess) unless it needs a process of its own (needs_process)."""
    argv = launch_argv(overrides, tiny)
    if needs_process(argv, env):
        return launch_subprocess(*overrides, tiny=tiny, timeout=timeout, env=env)
    from inprocess import run_launch_py

    return run_launch_py(argv)


@contextlib.contextmanager
def single_threaded():
    """One intra-op thread inside the block: tiny matmuls gain nothing from a second one and lose a lot when the 2
    CPUs are shared. Hydra's global state is cleared after it (module fixtures compose many runs inside)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        GlobalHydra.instance().clear()


@pytest.fixture
def one_thread():
    with single_threaded():
        yield


@pytest.fixture
def run_launch():
    return launch


# ------------------------------------------------------------------------------------------ the fast tier

FAST_TIER = os.environ.get("CURRYTRAIN_TEST_TIER") == "fast"
"""`make test-fast`: the tests that start no Python process (no subprocess of launch.py or the CLI, no workers).
A test that tries is skipped there, so the tier needs no hand-kept list; `make test` runs everything."""


def _starts_python(args) -> bool:
    program = Path(str(args[0] if isinstance(args, list | tuple) else str(args).split()[0]))
    return program.name.startswith("python") or program.parent == Path(sys.executable).parent


LOAD_TESTS = os.environ.get("CURRYTRAIN_LOAD_TESTS") == "1"
"""The load tests (10,000 steps logged at full speed, a 50-trial sweep) take minutes: `make reliability` sets it."""


def pytest_collection_modifyitems(config, items):
    if LOAD_TESTS:
        return
    skip = pytest.mark.skip(reason="a load test (minutes): make reliability runs it, or CURRYTRAIN_LOAD_TESTS=1")
    for item in items:
        if item.get_closest_marker("load") is not None:
            item.add_marker(skip)


def pytest_configure(config):
    """In the fast tier, starting a Python process (a subprocess or a worker) skips the test that tries."""
    if not FAST_TIER:
        return
    import multiprocessing.process

    popen_init = subprocess.Popen.__init__

    def popen(self, args, *rest, **kwargs):
        if _starts_python(args):
            pytest.skip("starts a Python process: make test runs it")
        popen_init(self, args, *rest, **kwargs)

    def start(self):
        pytest.skip("starts worker processes: make test runs it")

    subprocess.Popen.__init__ = popen
    multiprocessing.process.BaseProcess.start = start
