"""The Optuna sweeper plugin: discovered by Hydra, run the way Hydra tests sweepers, and run for real through
launch.py (real trials, real SQLite storage, files read back): results, resume, a killed sweeper, NaN trials,
hydra-optuna-sweeper configs, bad input."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.test_utils.test_utils import TSweepRunner
from omegaconf import OmegaConf
from optuna.trial import TrialState

from conftest import ROOT, TINY, launch
from currytrain.sweep.config import SWEEP_PRESETS
from currytrain.sweep.driver import check, merge_settings
from currytrain.sweep.space import parse_params
from currytrain.sweep.study import ENV_SPEC, ENV_TRIAL, SweepSpec, open_storage
from tests.sweep_app.app import quadratic, two_objectives


def _study(sweep_dir: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(f"sqlite:///{sweep_dir / 'optuna.db'}"))


def test_hydra_discovers_the_sweeper_and_its_hydra_optuna_sweeper_name():
    """Here hydra-optuna-sweeper is not installed, so its class path, its module paths and `optuna` name are
    curryTrain's. The checkout's folder under that plugin's path is an alias the wheel leaves out
    (tests/test_sweep_coexist.py installs both side by side and checks that no file is shared)."""
    from hydra_plugins.currytrain_sweeper.sweeper import CurryTrainSweeper
    from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper

    names = {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Sweeper)}
    assert "hydra_plugins.currytrain_sweeper.sweeper.CurryTrainSweeper" in names
    assert "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper" in names
    assert issubclass(OptunaSweeper, CurryTrainSweeper)
    assert (ROOT / "hydra_plugins" / "hydra_optuna_sweeper" / "_currytrain_alias.py").is_file()
    assert ConfigStore.instance().load("hydra/sweeper/optuna.yaml").provider == "currytrain"


def test_search_space_follows_hydra_syntax_with_a_python_range():
    space, problems = parse_params(
        {"a": "range(1, 4)", "b": "tag(log, interval(1e-4, 1e-2))", "c": "int(interval(2, 8))", "d": "choice(x, y)", "e": "range(0.1, 0.4, 0.1)", "f": 3},
        "sweep.params",
    )
    assert problems == []
    assert space.dimensions["a"].grid() == [1, 2, 3]  # stop excluded, as in Python (hydra-optuna-sweeper 1.3 includes 4)
    assert space.dimensions["b"].log and space.dimensions["b"].kind == "float"
    assert space.dimensions["c"].kind == "int"
    assert space.dimensions["d"].choices == ("x", "y")
    assert [round(v, 6) for v in space.dimensions["e"].grid()] == [0.1, 0.2, 0.3]
    assert space.fixed == {"f": "3"}


@pytest.mark.parametrize("preset", SWEEP_PRESETS)
def test_every_preset_passes_its_checks_and_builds_its_sampler_and_pruner(preset, compose_cfg, tmp_path):
    from currytrain.build import build
    from currytrain.sweep.driver import SweepLoop

    cfg = compose_cfg(f"sweep={preset}")
    settings, paths, problems = merge_settings(cfg, {})
    space = check(settings, paths, [], cfg, problems)
    loop = SweepLoop(settings, space, launcher=None, sweep_dir=tmp_path)
    assert type(loop._sampler(trials_done=0)).__name__ == settings["sampler"]["_target_"].rpartition(".")[2]
    if settings["pruner"]:
        assert build(OmegaConf.create(settings["pruner"])) is not None
    assert 1 <= loop.target() <= settings["n_trials"]


def test_bad_sweep_settings_name_each_key_and_fix(compose_cfg):
    cfg = compose_cfg("sweep=tpe")
    keys = {
        "sampler": {"_target_": "optuna.samplers.TPESamplr"},
        "params": {"optimizer.lr": "interval(0.1)", "optimizer.weight_decay": "tag(log, interval(0, 1))", "model.dim": "choice()"},
        "objective": "val/accuracy",
        "pruner": {"_target_": "optuna.pruners.MedianPruner", "n_warmup_step": 1},
    }
    settings, paths, problems = merge_settings(cfg, keys)
    with pytest.raises(Exception) as error:
        check(settings, paths, [], cfg, problems)
    message = str(error.value)
    assert "hydra.sweeper.sampler._target_=optuna.samplers.TPESamplr" in message and "did you mean optuna.samplers.TPESampler" in message
    assert "hydra.sweeper.params.optimizer.lr=interval(0.1)" in message
    assert "hydra.sweeper.params.optimizer.weight_decay" in message and "positive low bound" in message
    assert "hydra.sweeper.params.model.dim=choice()" in message
    assert "hydra.sweeper.objective=val/accuracy is not a metric" in message
    assert "hydra.sweeper.pruner.n_warmup_step is not an argument of MedianPruner" in message


BAD_SWEEP = """# @package _global_
defaults:
  - /schema/sweep/tpe@sweep
  - override /hydra/sweeper: currytrain
  - _self_
sweep:
  sampler: {_target_: optuna.samplers.NoSuchSampler}
  objective: val/acc
  params:
    optimizer.lr: tag(log, interval(0, 1))
    model.dim: choice()
    optimizer.weight_decay: interval(0.1)
hydra:
  mode: MULTIRUN
"""


def test_bad_sweep_exits_2_before_any_trial(tmp_path):
    (tmp_path / "conf" / "sweep").mkdir(parents=True)
    (tmp_path / "conf" / "sweep" / "bad.yaml").write_text(BAD_SWEEP)
    sweep_dir = tmp_path / "sweep"
    result = launch(f"--config-dir={tmp_path / 'conf'}", "sweep=bad", f"hydra.sweep.dir={sweep_dir}")
    assert result.returncode == 2, result.stderr[-3000:]
    expected = (
        "sweep.sampler._target_=optuna.samplers.NoSuchSampler is not a class of optuna.samplers",
        "sweep.params.optimizer.lr=tag(log, interval(0, 1)): a log interval needs a positive low bound",
        "sweep.params.model.dim=choice(): ",
        "sweep.params.optimizer.weight_decay=interval(0.1)",
        "sweep.objective=val/acc is not a metric",
    )
    for line in expected:
        assert line in result.stderr, line
    assert not sweep_dir.exists()


def test_a_swept_key_that_is_not_in_the_config_exits_2(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = launch("-m", "sweep=tpe", "optimizer.lrr=interval(0.1, 0.2)", f"hydra.sweep.dir={sweep_dir}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "optimizer.lrr is not a key of the config (did you mean optimizer.lr?)" in result.stderr
    assert not sweep_dir.exists()


def test_pruning_hook_reports_and_prunes_through_real_storage(tmp_path, monkeypatch):
    from currytrain.sweep.pruning import build_pruning_hook
    from currytrain.trainer.hooks import Action

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=open_storage(storage))
    first = study.ask()
    for step, value in ((2, 1.0), (4, 0.9)):
        first.report(value, step)
    study.tell(first, 0.9)
    second = study.ask()
    spec = SweepSpec("s", storage, ["minimize"], ["val/loss"], {"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 1, "n_warmup_steps": 0})
    monkeypatch.setenv(ENV_SPEC, str(spec.save(tmp_path)))
    monkeypatch.setenv(ENV_TRIAL, str(second.number))
    hook = build_pruning_hook()
    assert hook.after_step(1, {"train/loss": 9.0}).action is Action.CONTINUE  # no eval, nothing to report
    assert hook.after_step(2, {"val/loss": 0.95}).action is Action.CONTINUE  # better than the median at step 2 (1.0)
    decision = hook.after_step(4, {"val/loss": 5.0})
    assert decision.action is Action.PRUNE and "val/loss=5.0000 at step 4" in decision.reason
    assert study.trials[second.number].intermediate_values == {2: 0.95, 4: 5.0}  # the best (0.95) is worse than 0.9


@pytest.mark.parametrize("mode", ["fail", "requeue"])
def test_trials_a_killed_sweeper_left_running_are_recovered_from_their_journals(tmp_path, mode):
    from currytrain.journal import Journal
    from currytrain.sweep.study import counted, recover_interrupted

    study = optuna.create_study(study_name="s", storage=open_storage(f"sqlite:///{tmp_path / 'optuna.db'}"))
    endings = {
        0: ("finish", {"step": 6, "val_loss": 2.5, "seconds": 1.0}),
        1: ("pruned", {"message": "pruned at step 3"}),
        2: ("failure", {"message": "boom"}),
        3: None,
    }
    space = {"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}
    for number, ending in endings.items():
        trial = study.ask(space)
        trial.set_user_attr("run_dir", str(tmp_path / str(number)))
        journal = Journal(tmp_path / str(number) / "journal.jsonl")
        journal.event("start", step=0, num_params=10)
        if ending:
            journal.event(ending[0], **ending[1])
    recover_interrupted(study, ["val/loss"], mode)
    trials = study.get_trials()
    assert [t.state for t in trials[:4]] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.FAIL]
    assert trials[0].value == 2.5 and "boom" in trials[2].user_attrs["reason"] and trials[3].user_attrs["interrupted"]
    if mode == "fail":
        assert len(trials) == 4 and counted(study) == 4
    else:  # the interrupted trial is asked again with its parameters and does not count twice
        assert trials[4].state == TrialState.WAITING and counted(study) == 3
        assert study.ask(space).params["lr"] == trials[3].params["lr"]


def _prune_on_rank(rank: int, world: int, port: int, spec_path: str, number: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from currytrain.sweep.pruning import build_pruning_hook

    torch.set_num_threads(1)
    os.environ.update({"RANK": str(rank), ENV_SPEC: spec_path, ENV_TRIAL: str(number)})
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        hook = build_pruning_hook()
        decisions = [hook.after_step(step, {"val/loss": value}).action.value for step, value in ((2, 0.95), (4, 5.0))]
        Path(out, f"rank{rank}").write_text(",".join(decisions) + f",{hook.trial is not None}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_in_a_two_worker_trial_rank_0_decides_and_every_rank_prunes(tmp_path):
    import socket

    import torch.multiprocessing as mp

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=open_storage(storage))
    first = study.ask()
    first.report(1.0, 2)
    first.report(0.9, 4)
    study.tell(first, 0.9)
    second = study.ask()
    spec = SweepSpec("s", storage, ["minimize"], ["val/loss"], {"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 1})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_prune_on_rank, args=(2, port, str(spec.save(tmp_path)), second.number, str(tmp_path)), nprocs=2)
    assert (tmp_path / "rank0").read_text() == "continue,prune,True"
    assert (tmp_path / "rank1").read_text() == "continue,prune,False"  # rank 1 never opened the study
    assert study.trials[second.number].intermediate_values == {2: 0.95, 4: 5.0}  # reported once, by rank 0


@pytest.mark.slow
def test_sweep_runner_with_a_hydra_optuna_sweeper_config(hydra_sweep_runner: TSweepRunner, tmp_path):
    """A plain Hydra app (no curryTrain run) swept the way Hydra tests its sweepers."""
    sweep = hydra_sweep_runner(
        calling_file=None,
        calling_module="tests.sweep_app.app",
        task_function=quadratic,
        config_path=".",
        config_name="config",
        overrides=[f"hydra.sweep.dir={tmp_path}"],
        temp_dir=tmp_path,
    )
    with sweep:  # the runner removes its folder on exit: read everything inside
        results = OmegaConf.load(tmp_path / "optimization_results.yaml")
        study = _study(tmp_path, "quadratic")
        trials = study.trials
    assert len(trials) == 8 and all(t.state == TrialState.COMPLETE for t in trials)
    assert all(t.params["n"] in (1, 2, 3) for t in trials)  # range(1, 4) never gives 4
    assert results.best_value == pytest.approx(min(t.value for t in trials))
    assert set(results.best_params) == {"x", "y", "n", "op"}


@pytest.mark.slow
def test_multi_objective_sweep_writes_its_pareto_front(hydra_sweep_runner: TSweepRunner, tmp_path):
    sweep = hydra_sweep_runner(
        calling_file=None,
        calling_module="tests.sweep_app.app",
        task_function=two_objectives,
        config_path=".",
        config_name="multi",
        overrides=[],
        temp_dir=tmp_path,
    )
    with sweep:
        results = OmegaConf.load(tmp_path / "optimization_results.yaml")
        trials = _study(tmp_path, "pareto").trials
    assert len(trials) == 6 and all(len(t.values) == 2 for t in trials)  # no objective names: the returned pair
    front = {(s["values"][0], s["values"][1]) for s in results.solutions}
    dominated = [t for t in trials if any(o.values[0] <= t.values[0] and o.values[1] >= t.values[1] and o.values != t.values for o in trials)]
    assert front and not front & {tuple(t.values) for t in dominated}


@pytest.mark.slow
def test_sweep_tpe_writes_results_report_and_resumes_to_n_trials(tmp_path):
    sweep_dir = tmp_path / "tpe"
    # A ~key deletion on the command line reaches every trial as written (TPE then starts with its default).
    args = ("-m", "sweep=tpe", f"hydra.sweep.dir={sweep_dir}", "~sweep.sampler.n_startup_trials")
    result = launch(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    study = _study(sweep_dir, "tpe")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 6
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["best_value"] == pytest.approx(study.best_value) and results["best_trial"] == study.best_trial.number
    assert set(results["best_params"]) == {"optimizer.lr"}
    report = (sweep_dir / "report.md").read_text()
    assert report.count("| COMPLETE |") == 6 and "## Parameter importances" in report
    assert all(f"| {t.number} | COMPLETE | {t.value:.4f} | 6 |" in report for t in study.trials)  # the step trained, past the last eval
    assert (sweep_dir / "optimization_history.png").stat().st_size > 1000
    for trial in study.trials:  # each trial ran in its own folder, and reported its eval to the study
        assert Path(trial.user_attrs["run_dir"]) == sweep_dir / str(trial.number)
        assert trial.intermediate_values and "finish" in (sweep_dir / str(trial.number) / "journal.jsonl").read_text()
    again = launch(*args, "sweep.n_trials=7")  # the same command resumes: one more trial, not seven
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(_study(sweep_dir, "tpe").trials) == 7 and not (sweep_dir / "7").exists()


@pytest.mark.slow
def test_hydra_optuna_sweeper_config_runs_unchanged_and_a_nan_trial_is_fail_not_best(tmp_path):
    (tmp_path / "hparams_search").mkdir()
    (tmp_path / "hparams_search" / "init_optuna.yaml").write_text(
        "# @package _global_\n"
        "defaults:\n  - override /hydra/sweeper: optuna\n"
        "hydra:\n  mode: MULTIRUN\n  sweeper:\n"
        "    _target_: hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper\n"
        "    storage: null\n    study_name: null\n    n_jobs: 2\n    direction: minimize\n    n_trials: 2\n    max_failure_rate: 0.5\n"
        "    sampler:\n      _target_: optuna.samplers.GridSampler\n      seed: 1234\n"
        "    params:\n      model.init_std: choice(0.02, 1e38)\n"
    )
    sweep_dir = tmp_path / "sweep"
    # One batch of 2 trials: one failed half is not above max_failure_rate=0.5, so the sweep ends normally.
    result = launch(f"--config-dir={tmp_path}", "+hparams_search=init_optuna", f"hydra.sweep.dir={sweep_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    trials = {t.params["model.init_std"]: t for t in _study(sweep_dir, "currytrain").trials}
    # abort=default stops the diverged trial at its first non-finite loss (with abort=none it would fail on
    # its final val loss instead): either way the trial is FAIL with the reason, never a best value.
    reason = trials[1e38].user_attrs["reason"]
    assert trials[1e38].state == TrialState.FAIL and ("abort.non_finite_loss" in reason or "the final val loss is nan" in reason), reason
    assert trials[0.02].state == TrialState.COMPLETE
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["best_params"] == {"model.init_std": 0.02} and math.isfinite(results["best_value"])
    ending = (Path(trials[1e38].user_attrs["run_dir"]) / "journal.jsonl").read_text()
    assert '"type": "abort"' in ending or '"type": "failure"' in ending


@pytest.mark.slow
def test_a_killed_sweeper_resumes_to_exactly_n_trials(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # Trials long enough (a few hundred tiny steps) that the kill lands while trial 3 trains: with TINY's six
    # steps a fast machine finished the trial inside one poll, and the resume then rightly recovered it.
    longer = ["trainer.max_steps=300", "trainer.eval_every=150", "trainer.log_every=10"]
    args = ["-m", "sweep=random", "sweep.n_trials=5", *longer, f"hydra.sweep.dir={sweep_dir}"]
    command = [sys.executable, str(ROOT / "launch.py"), *args[:1], *TINY, *args[1:]]
    sweeper = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    journal, deadline = sweep_dir / "3" / "journal.jsonl", time.monotonic() + 900  # minutes only on a loaded machine
    while '"type": "metrics"' not in (journal.read_text() if journal.exists() else "") and sweeper.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    sweeper.send_signal(signal.SIGKILL)  # three trials done, the fourth one training
    sweeper.wait()
    assert '"type": "finish"' not in journal.read_text()
    assert sum(t.state == TrialState.COMPLETE for t in _study(sweep_dir, "random").trials) == 3
    again = launch(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    trials = _study(sweep_dir, "random").trials
    assert [t.number for t in trials] == [0, 1, 2, 3, 4]
    assert all(t.state.is_finished() for t in trials)
    assert trials[3].state == TrialState.FAIL and trials[3].user_attrs["interrupted"]
    assert len({t.user_attrs["run_dir"] for t in trials}) == 5
    assert len({t.params["optimizer.lr"] for t in trials}) == 5  # reseeded: the resumed sampler does not replay


@pytest.mark.slow
def test_submitit_local_keeps_n_jobs_trials_in_flight_and_records_pruned_trials(tmp_path):
    sweep_dir = tmp_path / "asha"
    result = launch("-m", "sweep=asha", "hydra/launcher=submitit_local", "sweep.n_jobs=2", "sweep.n_trials=3", f"hydra.sweep.dir={sweep_dir}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "asynchronous trials: up to 2 in flight" in result.stdout + result.stderr
    trials = _study(sweep_dir, "asha").trials
    assert len(trials) == 3 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert (sweep_dir / ".submitit").is_dir() and (sweep_dir / "optimization_results.yaml").is_file()
    for trial in trials:  # a pruned trial stopped at an eval and journaled why
        journal = (sweep_dir / str(trial.number) / "journal.jsonl").read_text()
        assert ('"type": "pruned"' in journal) == (trial.state == TrialState.PRUNED)


@pytest.mark.slow
def test_confirm_top_k_reruns_the_best_configs_at_fresh_seeds_and_names_the_winner(tmp_path):
    """sweep.confirm_top_k=2: after the grid's 2 trials, each config runs again at 3 seeds no trial used; the
    report names the winner only because the other config is worse on every shared seed (paired, currytrain.stats).
    A rerun of the command reuses the finished confirmation runs."""
    sweep_dir = tmp_path / "grid"
    args = ("-m", "sweep=grid", "optimizer.lr=choice(3e-3,1e-5)", "sweep.confirm_top_k=2", f"hydra.sweep.dir={sweep_dir}")
    result = launch(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    study = _study(sweep_dir, "grid")
    assert len(study.trials) == 2, "confirmation runs are not trials of the study"
    best = next(t for t in study.trials if t.params["optimizer.lr"] == 3e-3)
    confirmation = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())["confirmation"]
    assert confirmation["seeds"] == [1, 2, 3] and confirmation["winner_trial"] == best.number
    for config in confirmation["configs"]:
        assert sorted(config["values"]) == [1, 2, 3]
        for seed, value in config["values"].items():
            run = sweep_dir / "confirm" / f"trial_{config['trial']}" / f"seed_{seed}"
            resolved = yaml.safe_load((run / "resolved.yaml").read_text())
            assert resolved["seed"] == seed and resolved["optimizer"]["lr"] == config["params"]["optimizer.lr"]
            finish = [line for line in (run / "journal.jsonl").read_text().splitlines() if '"finish"' in line]
            assert len(finish) == 1 and math.isclose(yaml.safe_load(finish[0])["val_loss"], value, rel_tol=1e-6)
    report = (sweep_dir / "report.md").read_text()
    assert "## Confirmation: the top 2 configs rerun at 3 fresh seeds" in report
    assert f"**Winner: trial {best.number}**" in report and "is worse than trial" in report and "3 paired seeds" in report
    journals = sorted((sweep_dir / "confirm").rglob("journal.jsonl"))
    before = [path.stat().st_mtime_ns for path in journals]
    again = launch(*args)  # the study is done and every confirmation run finished: nothing trains again
    assert again.returncode == 0, again.stderr[-3000:]
    assert [path.stat().st_mtime_ns for path in journals] == before
    assert f"**Winner: trial {best.number}**" in (sweep_dir / "report.md").read_text()


def test_confirmation_names_no_winner_when_the_best_is_not_shown_better():
    """The decision alone: a best config whose lead over another is inside the seed noise is not named the winner."""
    from currytrain.sweep.confirm import Candidate, Confirmation

    tied = Confirmation(
        [1, 2, 3], [Candidate(0, {"x": 1}, 1.00, {1: 1.00, 2: 1.10, 3: 0.95}), Candidate(1, {"x": 2}, 1.01, {1: 1.02, 2: 1.05, 3: 1.01})], maximize=False
    )
    tied.decide()
    assert tied.winner is None and tied.verdicts[0].word == "inconclusive"
    assert "No winner named" in "\n".join(tied.lines("val/loss"))
    clear = Confirmation(
        [1, 2, 3], [Candidate(0, {"x": 1}, 1.0, {1: 1.00, 2: 1.10, 3: 0.95}), Candidate(1, {"x": 2}, 2.0, {1: 2.01, 2: 2.12, 3: 1.95})], maximize=False
    )
    clear.decide()
    assert clear.winner is not None and clear.winner.trial == 0 and clear.verdicts[0].word == "worse"
    single = Confirmation([1, 2, 3], [Candidate(0, {"x": 1}, 1.0, {1: 1.0}), Candidate(1, {"x": 2}, 2.0, {1: 2.0, 2: 2.1})], maximize=False)
    single.decide()
    assert single.winner is None and not single.verdicts, "one shared seed is no test: no winner"


def test_confirm_settings_are_checked(compose_cfg):
    settings, paths, problems = merge_settings(compose_cfg("sweep=tpe", "sweep.confirm_top_k=-1", "sweep.confirm_seeds=1"), {})
    from currytrain.sweep.checks import sweep_problems

    found = "\n".join(sweep_problems(settings, paths))
    assert "sweep.confirm_top_k=-1 must be an integer >= 0" in found and "sweep.confirm_seeds=1 must be an integer >= 2" in found
    settings, paths, _ = merge_settings(
        compose_cfg("sweep=tpe", "sweep.confirm_top_k=2", "sweep.direction=[minimize,minimize]", "sweep.objective=[val/loss,train/loss]"), {}
    )
    assert any("multi-objective study has a Pareto front" in p for p in sweep_problems(settings, paths))


def test_the_report_shows_the_last_step_each_trial_trained(tmp_path):
    """Optuna's last_step is the last eval a trial reported to the pruner; the report's column is the step its run
    trained to (its journal's), here past the last eval."""
    from currytrain.sweep.report import trials_table

    assert launch("trainer.eval_every=4", "logger=[jsonl]", f"hydra.run.dir={tmp_path / '0'}").returncode == 0
    study = optuna.create_study()
    trial = study.ask()
    trial.report(2.5, 4)
    trial.set_user_attr("run_dir", str(tmp_path / "0"))
    study.tell(trial, 2.4)
    assert study.trials[0].last_step == 4
    assert "| 0 | COMPLETE | 2.4000 | 6 |" in "\n".join(trials_table(study, ["val/loss"]))


SCAFFOLD_LRS = (7e-3, 1e-1)
"""The learning rates at which the lm scaffold's 200 steps end within 5% of its best val loss (measured: 3e-3 1.19,
1e-2 0.94, 3e-2 0.96, 1e-1 0.97 nats/token; chance 5.55)."""


@pytest.mark.parametrize("preset", ["tpe", "random", "cmaes", "gp", "qmc", "grid", "asha", "hyperband"])
def test_each_preset_tries_a_learning_rate_the_scaffolds_learn_with(preset, compose_cfg):
    """The trials each preset's sampler draws (with its seed, over its space; the loss a curve with its best at 2e-2
    as the scaffold's) include one in SCAFFOLD_LRS within its n_trials; tpe's within the 3 trials of the guide's sweep."""
    from currytrain.build import build
    from currytrain.sweep.space import parse_params

    cfg = compose_cfg(f"sweep={preset}")
    space, problems = parse_params(cfg.sweep.params, "sweep.params")
    runtime = {"search_space": space.grid()} if str(cfg.sweep.sampler._target_).endswith("GridSampler") else {}
    study = optuna.create_study(sampler=build(cfg.sweep.sampler, **runtime))
    tried = []
    trials = 3 if preset == "tpe" else min(cfg.sweep.n_trials, len(space.grid().get("optimizer.lr", [])) - 1 if runtime else 99)
    for _ in range(trials):
        trial = study.ask({key: dimension.distribution() for key, dimension in space.dimensions.items()})
        tried.append(trial.params["optimizer.lr"])
        study.tell(trial, (math.log10(tried[-1]) + 1.7) ** 2)
    assert not problems and any(SCAFFOLD_LRS[0] <= lr <= SCAFFOLD_LRS[1] for lr in tried), [f"{lr:.1e}" for lr in tried]
