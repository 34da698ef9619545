"""What the security tests share: one small trusted run with checkpoints, copied into each test's own folder
before it is tampered with."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import launch

RUN = ("data.max_bytes=300000", "trainer.max_steps=4", "trainer.checkpoint_every=2", "trainer.eval_every=2", "logger=[jsonl]")
"""4 TINY steps with checkpoints at steps 2 and 4."""


@pytest.fixture(scope="session")
def trusted_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("trusted") / "run"
    result = launch(*RUN, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.fixture
def run_copy(trusted_run, tmp_path) -> Path:
    """A copy of the trusted run, to tamper with."""
    copy = tmp_path / "run"
    shutil.copytree(trusted_run, copy, ignore=shutil.ignore_patterns("run.lock"))
    return copy
