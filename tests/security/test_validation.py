"""Validation cannot be switched off by its own input. A file a config points at (a checkpoint's COMPLETE marker, an
import folder's model.yaml) of the wrong shape is a problem reported like any other (exit 2, naming the file),
where an exception inside Hydra's validation callback used to become a warning and let the run go on unvalidated;
a crash of validation itself stops the command (exit 1, with the traceback) and runs nothing."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import pytest

from conftest import launch
from currytrain.config import store_schemas
from currytrain.logger.config import JsonlConfig
from currytrain.weights import MARKER

BAD = ("+trainer.max_step=10", "optimizer.lr=-1")
"""Problems validation must still report: an unknown key and a negative learning rate."""


def _marker_model_is_text(run_copy, tmp_path):
    step = run_copy / "checkpoints" / "step_4"
    marker = json.loads((step / MARKER).read_text())
    (step / MARKER).write_text(json.dumps({**marker, "model": "gqa", "files": None}))
    return [f"trainer.resume={step}"], f"{step / MARKER}'s model is not a model config node"


def _marker_config_is_a_list(run_copy, tmp_path):
    step = run_copy / "checkpoints" / "step_4"
    marker = json.loads((step / MARKER).read_text())
    (step / MARKER).write_text(json.dumps({**marker, "config": [1, 2], "files": None}))
    return [f"trainer.resume={step}"], f"{step / MARKER}'s config is not a mapping"


def _model_yaml_is_a_list(run_copy, tmp_path):
    folder = tmp_path / "import"
    folder.mkdir()
    (folder / "model.yaml").write_text("- 1\n- 2\n")
    return [f"trainer.init_from={folder}"], f"{folder / 'model.yaml'} holds a list, not a mapping"


def _resolved_is_nested_interpolations(run_copy, tmp_path):
    """About 700 bytes whose interpolations expand to 10**30 characters: reading it must not hang."""
    shutil.rmtree(run_copy / "checkpoints" / "step_4")
    lines = ["a0: xxxxxxxxxx"] + [f"a{i}: ${{a{i - 1}}}${{a{i - 1}}}${{a{i - 1}}}${{a{i - 1}}}${{a{i - 1}}}" for i in range(1, 40)]
    (run_copy / "resolved.yaml").write_text("\n".join(lines) + "\nmodel: ${a39}\n")
    return [f"trainer.init_from={run_copy}"], "resolved.yaml holds an interpolation at a1"


CASES = {
    "COMPLETE marker whose model is text": _marker_model_is_text,
    "COMPLETE marker whose config is a list": _marker_config_is_a_list,
    "init_from folder whose model.yaml is a list": _model_yaml_is_a_list,
    "resolved.yaml of nested interpolations": _resolved_is_nested_interpolations,
}


@pytest.mark.reliability(
    kind="untrusted",
    artifact="a file validation reads (marker, model.yaml, resolved.yaml)",
    refused_by="its shape checked: a problem, never a warning that skips validation",
)
@pytest.mark.parametrize("case", list(CASES))
def test_a_file_of_the_wrong_shape_is_a_problem_and_validation_still_runs(case, run_copy, tmp_path):
    overrides, expected = CASES[case](run_copy, tmp_path)
    run_dir = tmp_path / "new"
    result = launch(*overrides, *BAD, f"hydra.run.dir={run_dir}", timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert expected in result.stderr and "Traceback" not in result.stderr and "UserWarning" not in result.stderr, result.stderr[-3000:]
    assert "trainer.max_step is not a field" in result.stderr and "optimizer.lr=-1" in result.stderr, "the other problems are still found"
    assert not run_dir.exists()


@dataclass
class BuggyCheckConfig(JsonlConfig):
    """A logger schema whose own check has a bug: it raises where it should return problems."""

    @staticmethod
    def check(node, path):
        raise RuntimeError("a bug inside a check")


def test_a_crash_inside_validation_stops_the_command_with_its_traceback_and_runs_nothing(tmp_path):
    store_schemas({"logger": {"buggy": BuggyCheckConfig}})
    (tmp_path / "conf" / "logger").mkdir(parents=True)
    (tmp_path / "conf" / "logger" / "buggy.yaml").write_text("# @package logger.buggy\ndefaults:\n  - /schema/logger/buggy@_here_\n  - _self_\n")
    run_dir = tmp_path / "run"
    result = launch(f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "+logger@logger.buggy=buggy", f"hydra.run.dir={run_dir}")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "validating the config failed; nothing ran" in result.stderr and "RuntimeError: a bug inside a check" in result.stderr, result.stderr[-3000:]
    assert "Traceback" in result.stderr and not run_dir.exists()


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder no run may write into: made read-only by its mode, or (for root, whom modes do not stop) a read-only
    tmpfs mounted there; the test skips where neither can be had."""
    import os
    import subprocess

    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    mounted = False
    if os.access(folder, os.W_OK):
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True).returncode == 0
        if not mounted:
            folder.chmod(0o755)
            pytest.skip("cannot make a folder read-only here (root, and no mount)")
    yield folder
    if mounted:
        subprocess.run(["umount", str(folder)], capture_output=True)
    folder.chmod(0o755)


@pytest.mark.reliability(kind="bad input", group="hydra")
def test_a_read_only_run_folder_is_refused_naming_it(read_only_folder):
    result = launch(f"hydra.run.dir={read_only_folder / 'run'}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"{read_only_folder} cannot be written" in result.stderr and "Traceback" not in result.stderr and "UserWarning" not in result.stderr, result.stderr[
        -3000:
    ]
