"""Bad inputs that need a run's files: refused with exit 2, the key and the fix, no traceback, nothing written."""

from __future__ import annotations

import shutil

import pytest

from conftest import launch
from reliability.runs import RUN


@pytest.fixture(scope="module")
def finished(uninterrupted, tmp_path_factory):
    """A checkpoint copied out of its run folder (no resolved.yaml beside it), and the run itself."""
    loose = tmp_path_factory.mktemp("loose") / "step_8"
    shutil.copytree(uninterrupted / "checkpoints" / "step_8", loose)
    return uninterrupted, loose


CASES = {
    "a checkpoint copied out of its run, into another model": (
        ["model.dim=64", "trainer.resume={loose}"],
        "holds a model the config does not describe: pass model.dim=32",
    ),
    "resuming a checkpoint at or past trainer.max_steps": (["trainer.resume={loose}"], "is at step 8, so trainer.max_steps=8 leaves nothing to train"),
}


@pytest.mark.reliability(kind="bad input", group="trainer")
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_resume_is_refused_before_anything_is_written(case, finished, tmp_path):
    run, loose = finished
    overrides, expected = CASES[case]
    result = launch(*RUN, *(o.format(loose=loose) for o in overrides), f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()
