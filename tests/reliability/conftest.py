"""Fixtures of the fault tests: one uninterrupted run that every interrupted run must end equal to."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import launch
from reliability.runs import RUN


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = launch(*RUN, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir
