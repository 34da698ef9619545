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


@pytest.mark.reliability(kind="bad input", group="experiment")
def test_an_experiment_file_with_a_yaml_syntax_error_names_the_file_and_line(tmp_path):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "broken.yaml").write_text("# @package _global_\nmodel:\n  dim: [32\n")
    result = launch(f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "experiment=broken", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"experiment=broken: {tmp_path / 'conf' / 'experiment' / 'broken.yaml'} is not valid YAML (line 4, column 1: expected ',' or ']'" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.reliability(kind="bad input", group="data")
def test_a_binary_file_as_text_data_is_refused(tmp_path):
    import random

    blob = tmp_path / "corpus.txt"
    blob.write_bytes(random.Random(0).randbytes(20000))
    result = launch("data=text", f"data.paths=[{blob}]", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"data.paths: {blob} is not UTF-8 text" in result.stderr
    assert not (tmp_path / "run").exists()
