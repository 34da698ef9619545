"""An Optuna study is an untrusted artifact: anyone who shares its storage (or hands over its folder) writes its
trials. Optuna's CmaEsSampler keeps its optimizer pickled in the trials' system attributes and unpickles it with
plain pickle when it samples; a resumed sweep checks that state against the exact globals a CMA-ES optimizer holds
before any sampler sees the study, and refuses a study that holds anything else (exit 2, nothing run)."""

from __future__ import annotations

import pickle

import pytest

from conftest import launch
from security.crafted import Mkdir

SPACE = {"optimizer.lr": (1e-4, 3e-2, True), "optimizer.weight_decay": (0.0, 0.3, False)}
"""sweep=cmaes's search space."""


def _crafted_study(sweep_dir, marker) -> None:
    """The study sweep=cmaes resumes in sweep_dir, with completed trials whose sampler state calls os.mkdir(marker)."""
    import optuna
    from optuna.distributions import FloatDistribution

    sweep_dir.mkdir(parents=True)
    study = optuna.create_study(study_name="cmaes", storage=f"sqlite:///{sweep_dir / 'optuna.db'}", direction="minimize")
    distributions = {key: FloatDistribution(low, high, log=log) for key, (low, high, log) in SPACE.items()}
    state = pickle.dumps(Mkdir(marker)).hex()
    for number in range(3):
        params = {"optimizer.lr": 1e-3 * (number + 1), "optimizer.weight_decay": 0.1}
        attrs = {"cma:optimizer:0": state, "cma:generation": 0}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=5.0 - number, system_attrs=attrs))


@pytest.mark.reliability(
    kind="untrusted",
    artifact="Optuna study (CMA-ES sampler state)",
    refused_by="opcode walk against the exact globals of a CMA-ES optimizer, before any sampler reads it",
)
def test_a_study_whose_sampler_state_runs_code_is_refused_before_the_sampler_reads_it(tmp_path):
    marker, sweep_dir = tmp_path / "ran", tmp_path / "sweep"
    _crafted_study(sweep_dir, marker)
    result = launch("-m", "sweep=cmaes", "sweep.n_trials=5", "trainer.max_steps=3", f"hydra.sweep.dir={sweep_dir}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "holds sampler state curryTrain does not unpickle" in result.stderr and "posix.mkdir" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and not marker.exists(), "the payload ran"
    assert not (sweep_dir / "3").exists(), "no trial started"
