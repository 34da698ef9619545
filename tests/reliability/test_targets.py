"""A `_target_` outside build()'s allow-list is refused at every entry point that takes config: a run's
overrides, an experiment file, a sweep config, a check ladder's stages, and a run folder handed to the HF
bridge (its resolved.yaml is a file anyone can edit). Each exits 2 naming the key, runs nothing of the
target (its shell command would leave a file), and writes no run folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, launch

HOSTILE = "os.system"


def _evil(victim: Path) -> str:
    """A node that, if built, runs a shell command that creates `victim`."""
    return f"{{_target_: {HOSTILE}, _args_: ['touch {victim}']}}"


def _conf(tmp_path: Path, group: str, text: str) -> str:
    (tmp_path / "conf" / group).mkdir(parents=True)
    (tmp_path / "conf" / group / "evil.yaml").write_text(text)
    return f"hydra.searchpath=[file://{tmp_path / 'conf'}]"


def overrides(tmp_path: Path, victim: Path) -> tuple[list[str], str]:
    return [f"+abort.evil={_evil(victim)}", f"hydra.run.dir={tmp_path / 'run'}"], "abort.evil._target_=os.system"


def experiment(tmp_path: Path, victim: Path) -> tuple[list[str], str]:
    path = _conf(tmp_path, "experiment", f"# @package _global_\nlogger:\n  evil: {_evil(victim)}\n")
    return [path, "experiment=evil", f"hydra.run.dir={tmp_path / 'run'}"], "logger.evil._target_=os.system"


def sweep(tmp_path: Path, victim: Path) -> tuple[list[str], str]:
    text = (
        "# @package _global_\ndefaults:\n  - /schema/sweep/tpe@sweep\n  - override /hydra/sweeper: currytrain\n  - _self_\n"
        f"sweep:\n  study_name: evil\n  n_trials: 2\n  sampler: {_evil(victim)}\n  params:\n    optimizer.lr: interval(1e-4, 1e-2)\n"
        "hydra:\n  mode: MULTIRUN\n"
    )
    return [_conf(tmp_path, "sweep", text), "sweep=evil", f"hydra.sweep.dir={tmp_path / 'run'}"], "sweep.sampler._target_=os.system"


def ladder(tmp_path: Path, victim: Path) -> tuple[list[str], str]:
    return ["check=sanity", f"+check.stages.evil={_evil(victim)}", f"hydra.run.dir={tmp_path / 'run'}"], "check.stages.evil._target_=os.system"


ENTRIES = {"run overrides": overrides, "experiment file": experiment, "sweep config": sweep, "check ladder stage": ladder}


@pytest.mark.reliability(kind="bad input", group="build")
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_a_target_outside_the_allow_list_is_refused_at_every_launch_entry(entry, tmp_path):
    victim = tmp_path / "victim"
    args, key = ENTRIES[entry](tmp_path, victim)
    result = launch(*args)
    assert result.returncode == 2, result.stderr[-3000:]
    assert key in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not victim.exists() and not (tmp_path / "run").exists()


@pytest.mark.reliability(kind="bad input", group="build")
def test_the_hf_bridge_refuses_a_run_folder_whose_model_target_is_outside_the_allow_list(uninterrupted, tmp_path):
    run_dir, victim = tmp_path / "run", tmp_path / "victim"
    shutil.copytree(uninterrupted, run_dir, ignore=shutil.ignore_patterns("step_2", "step_4", "step_6"))
    resolved = OmegaConf.load(run_dir / "resolved.yaml")
    resolved.model = OmegaConf.create({"_target_": HOSTILE, "_args_": [f"touch {victim}"]})
    OmegaConf.save(resolved, run_dir / "resolved.yaml")
    out = tmp_path / "hf"
    result = subprocess.run([sys.executable, "-m", "currytrain.cli", "hf", "export", str(run_dir), str(out)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "_target_=os.system is not a registered component" in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not victim.exists() and not out.exists()
