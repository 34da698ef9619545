"""hydra-optuna-sweeper's behaviours, held by curryTrain's sweeper on a plain Hydra app (tests/sweep_app: its
tasks return their objectives, its configs are written for that plugin): command-line values over `params`,
single- and multi-objective returns, custom_search_space, the deprecated search_space, empty spaces,
max_failure_rate per batch, the grid sampler, sampler and pruner arguments on the command line, removed
samplers, and bad input (exit 2, key and fix). Sweeps run in this process through Hydra's sweep runner; what
only a process shows (exit codes, stderr) runs tests/sweep_app/main.py as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.test_utils.test_utils import TSweepRunner
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from conftest import ROOT
from currytrain.errors import ConfigError
from currytrain.sweep.driver import SweepLoop, check, merge_settings
from currytrain.sweep.study import open_storage
from tests.sweep_app.app import quadratic, two_objectives, two_objectives_as_list

APP = ROOT / "tests" / "sweep_app" / "main.py"


@dataclass
class Swept:
    """What a plain app's sweep left, read before Hydra's sweep runner removes its folder."""

    results: dict
    jobs: dict[int, list[str]]
    """Each job's command-line overrides (its .hydra/overrides.yaml), by trial number."""
    report: str
    trials: list[optuna.trial.FrozenTrial]
    """The study's trials when the sweep ended."""
    returned: object


def sweep_app(runner: TSweepRunner, tmp_path: Path, *overrides: str, config: str = "config", task=quadratic) -> Swept:
    """Sweep tests/sweep_app in this process; the study's storage lies outside the runner's folder."""
    sweep_dir, storage = tmp_path / "sweep", f"sqlite:///{tmp_path / 'study.db'}"
    sweep = runner(
        calling_file=None,
        calling_module="tests.sweep_app.app",
        task_function=task,
        config_path=".",
        config_name=config,
        overrides=[f"hydra.sweeper.storage='{storage}'", *overrides],
        temp_dir=str(sweep_dir),
    )
    with sweep:
        results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
        jobs = {int(d.name): yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text()) for d in sweep_dir.iterdir() if d.name.isdigit()}
        report = (sweep_dir / "report.md").read_text()
    study = optuna.load_study(study_name=results["study_name"], storage=open_storage(storage))
    return Swept(results, jobs, report, study.trials, sweep.returns)


def run_app(sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """python tests/sweep_app/main.py --multirun ..., as a user types it."""
    command = [sys.executable, str(APP), "--multirun", f"hydra.sweep.dir={sweep_dir}", *overrides]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def trials_of(sweep_dir: Path, name: str = "quadratic") -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=open_storage(f"sqlite:///{sweep_dir / 'optuna.db'}")).trials


@pytest.mark.slow
def test_command_line_values_win_over_params_key_by_key(hydra_sweep_runner, tmp_path):
    # params sweeps y over choice(-1, 0, 1) and x over an interval: the command line fixes y and narrows x.
    swept = sweep_app(hydra_sweep_runner, tmp_path, "y=0", "x=choice(-1.5, 1.5)", "hydra.sweeper.n_trials=6")
    trials = swept.trials
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE for t in trials)
    assert all("y" not in t.params and t.params["x"] in (-1.5, 1.5) for t in trials)
    for number, overrides in swept.jobs.items():  # every job got y=0 once, and no sampled y
        assert [o for o in overrides if o.startswith("y=")] == ["y=0"], (number, overrides)
    assert "y" not in swept.results["best_params"]


def test_a_plain_app_keeps_a_fixed_command_line_value_in_every_trial(tmp_path):
    """The issue's command: python my_app.py --multirun hydra/sweeper=optuna 'x=range(-5,5)' y=0."""
    sweep_dir = tmp_path / "sweep"
    result = run_app(sweep_dir, "hydra/sweeper=optuna", "x=range(-5,5)", "y=0", "hydra.sweeper.n_trials=5")
    assert result.returncode == 0, result.stderr[-3000:]
    trials = trials_of(sweep_dir)
    assert len(trials) == 5 and all("y" not in t.params and t.params["x"] in range(-5, 5) for t in trials)
    for trial in trials:  # the job's own composed config holds y=0
        assert yaml.safe_load((sweep_dir / str(trial.number) / ".hydra" / "config.yaml").read_text())["y"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("task", [two_objectives, two_objectives_as_list])
def test_a_direction_list_takes_the_values_a_task_returns_as_a_pair_or_a_list(hydra_sweep_runner, tmp_path, task):
    swept = sweep_app(hydra_sweep_runner, tmp_path, config="multi", task=task)
    trials = swept.trials
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE and len(t.values) == 2 for t in trials)
    assert all(t.values == [quadratic_of(t), float(t.params["n"])] for t in trials)
    front = [tuple(s["values"]) for s in swept.results["solutions"]]
    assert front and all(set(s) >= {"params", "values"} for s in swept.results["solutions"])

    def dominates(a, b):  # minimize the first value, maximize the second
        return a[0] <= b[0] and a[1] >= b[1] and a != b

    assert not [p for p in front if any(dominates(tuple(t.values), p) for t in trials)]
    assert "| values[0] | values[1] |" in swept.report


def quadratic_of(trial) -> float:
    x, n = trial.params["x"], trial.params["n"]
    return (x - 0.5) ** 2 + n


@pytest.mark.slow
def test_custom_search_space_suggests_more_parameters_from_the_config(hydra_sweep_runner, tmp_path):
    swept = sweep_app(
        hydra_sweep_runner,
        tmp_path,
        "hydra.sweeper.custom_search_space=tests.sweep_app.app.near_x",
        "~hydra.sweeper.params.y",  # near_x suggests y itself
        "spread=0.25",
    )
    trials = swept.trials
    assert len(trials) == 8 and all(t.state == TrialState.COMPLETE for t in trials)
    for trial in trials:
        assert set(trial.params) == {"x", "y", "n", "op", "+w"}
        assert abs(trial.params["y"] - trial.params["x"]) <= 0.25 and 0 <= trial.params["+w"] <= 1
        assert f"+w={trial.params['+w']!r}" in swept.jobs[trial.number]  # a new key reaches the job with its +
    assert 0 <= swept.results["best_params"]["+w"] <= 1


@pytest.mark.slow
def test_the_deprecated_search_space_is_converted_with_a_warning(hydra_sweep_runner, tmp_path):
    legacy = "hydra.sweeper.search_space={x:{type:float,low:-1.0,high:1.0,step:0.5},n:{type:int,low:1,high:2}}"
    with pytest.warns(UserWarning, match="hydra.sweeper.search_space is deprecated"):
        swept = sweep_app(hydra_sweep_runner, tmp_path, legacy, "hydra.sweeper.params=null")
    trial = swept.trials[0]
    assert set(trial.params) == {"x", "n"}
    assert trial.distributions["x"] == FloatDistribution(-1.0, 1.0, step=0.5)  # its bounds are inclusive, as in that form
    assert trial.distributions["n"].high == 2


def test_the_deprecated_search_space_beside_params_is_ignored_with_a_warning(hydra_sweep_runner, tmp_path):
    legacy = "hydra.sweeper.search_space={z:{type:categorical,choices:[1,2]}}"
    with pytest.warns(UserWarning, match="search_space is ignored because hydra.sweeper.params is set"):
        swept = sweep_app(hydra_sweep_runner, tmp_path, legacy, "hydra.sweeper.n_trials=2")
    assert all(set(t.params) == {"x", "y", "n", "op"} for t in swept.trials)


@pytest.mark.slow
def test_an_empty_search_space_runs_n_trials_of_the_same_config(hydra_sweep_runner, tmp_path):
    swept = sweep_app(hydra_sweep_runner, tmp_path, "hydra.sweeper.params=null", "hydra.sweeper.n_trials=5")
    trials = swept.trials
    assert len(trials) == 5 and all(t.state == TrialState.COMPLETE and t.params == {} for t in trials)
    assert {t.value for t in trials} == {quadratic_of_config(x=0.0, y=0, n=1)}
    assert swept.returned is None  # as hydra-optuna-sweeper's sweep() returns


def quadratic_of_config(x: float, y: int, n: int) -> float:
    return (x - 0.5) ** 2 + y**2 + n


@pytest.mark.slow
def test_the_grid_sampler_walks_the_grid_once(hydra_sweep_runner, tmp_path):
    swept = sweep_app(
        hydra_sweep_runner,
        tmp_path,
        "hydra/sweeper/sampler=grid",
        "hydra.sweeper.params=null",
        "n=range(1, 4)",
        "op=choice(add, mul)",
        "hydra.sweeper.n_trials=20",
    )
    points = sorted((t.params["n"], t.params["op"]) for t in swept.trials)
    assert points == [(n, op) for n in (1, 2, 3) for op in ("add", "mul")]  # 6 of n_trials=20; range stops before 4


@pytest.mark.parametrize("rate", [0.4, 0.5])
def test_max_failure_rate_stops_after_the_first_batch_above_it_and_prints_the_task_error(tmp_path, rate):
    # A grid of 4 points in batches of 2; the task fails on n=1 only, so that batch's failed share is 0.5.
    sweep_dir = tmp_path / "sweep"
    grid = ("hydra/sweeper/sampler=grid", "hydra.sweeper.params=null", "n=choice(1, 2, 3, 4)", "fail_on=1", "hydra.sweeper.n_jobs=2")
    result = run_app(sweep_dir, *grid, f"hydra.sweeper.max_failure_rate={rate}")
    trials = trials_of(sweep_dir)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert [t.params["n"] for t in failed] == [1] and "the task fails on n=1" in failed[0].user_attrs["reason"]
    if rate < 0.5:  # 0.5 > 0.4: the sweep stops after that batch, with the task's own exception on stderr
        assert result.returncode == 1 and "RuntimeError: the task fails on n=1" in result.stderr, result.stderr[-3000:]
        assert len(trials) == (failed[0].number // 2 + 1) * 2
    else:  # 0.5 is not above 0.5: every trial runs, and the failure is recorded, not raised
        assert result.returncode == 0, result.stderr[-3000:]
        assert len(trials) == 4 and "RuntimeError" not in result.stderr


def compose_app(*overrides: str):
    """tests/sweep_app's config with its hydra node, as the sweeper receives it."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="tests.sweep_app", version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    GlobalHydra.instance().clear()
    keys = {key: value for key, value in cfg.hydra.sweeper.items() if key not in ("_target_", "_recursive_")}
    return cfg, keys


def test_sampler_and_pruner_arguments_are_set_on_the_command_line_without_plus(tmp_path):
    cfg, keys = compose_app(
        "hydra/sweeper/sampler=tpe",
        "hydra.sweeper.sampler.n_startup_trials=2",
        "hydra/sweeper/pruner=median",
        "hydra.sweeper.pruner.n_warmup_steps=3",
    )
    settings, paths, problems = merge_settings(cfg, keys)
    loop = SweepLoop(settings, check(settings, paths, [], cfg, problems), launcher=None, sweep_dir=tmp_path)
    assert loop._sampler(trials_done=0)._n_startup_trials == 2
    assert settings["pruner"] == {"_target_": "optuna.pruners.MedianPruner", "n_warmup_steps": 3}


def test_sweep_node_sampler_and_pruner_take_new_arguments_without_plus(compose_cfg):
    cfg = compose_cfg("sweep=asha", "sweep.sampler.n_ei_candidates=12", "sweep.pruner.bootstrap_count=1")
    assert cfg.sweep.sampler.n_ei_candidates == 12 and cfg.sweep.pruner.bootstrap_count == 1
    settings, paths, problems = merge_settings(cfg, {})
    check(settings, paths, [], cfg, problems)  # both are arguments of their classes
    cfg = compose_cfg("sweep=tpe", "sweep.pruner._target_=optuna.pruners.MedianPruner")  # a preset without a pruner
    assert cfg.sweep.pruner == {"_target_": "optuna.pruners.MedianPruner"}


def test_a_removed_sampler_is_named_with_the_reason():
    cfg, keys = compose_app("hydra/sweeper/sampler=motpe")
    settings, paths, problems = merge_settings(cfg, keys)
    with pytest.raises(ConfigError) as error:
        check(settings, paths, [], cfg, problems)
    assert "hydra.sweeper.sampler._target_=optuna.samplers.MOTPESampler: MOTPESampler is not in Optuna 4" in str(error.value)
    assert "optuna.samplers.TPESampler (hydra/sweeper/sampler=tpe)" in str(error.value)


BAD_INPUT = {
    "unknown sampler argument": (
        ("hydra/sweeper/sampler=tpe", "hydra.sweeper.sampler.n_startup_trails=2"),
        "hydra.sweeper.sampler.n_startup_trails is not an argument of TPESampler: remove it; valid arguments: [",
    ),
    "custom_search_space that does not import": (
        ("hydra.sweeper.custom_search_space=app.no_such_function",),
        "hydra.sweeper.custom_search_space=app.no_such_function cannot be imported (",
        "write the dotted path of a function (cfg, trial) -> None that the app's folder can import",
    ),
    "direction list longer than the returned values": (
        ("hydra.sweeper.direction=[minimize,maximize]",),
        "hydra.sweeper.direction has 2 direction(s) but the task returned 1 value(s)",
        "give one direction per returned value (e.g. hydra.sweeper.direction=[minimize])",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_exits_2_naming_the_key_and_the_fix(tmp_path, case):
    overrides, *messages = BAD_INPUT[case]
    result = run_app(tmp_path / "sweep", *overrides, "hydra.sweeper.n_trials=2")
    assert result.returncode == 2, result.stderr[-3000:]
    for message in messages:
        assert message in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_plain_app_resumes_its_study_and_gets_the_report(hydra_sweep_runner, tmp_path):
    first = sweep_app(hydra_sweep_runner, tmp_path, "hydra.sweeper.n_trials=4")
    again = sweep_app(hydra_sweep_runner, tmp_path, "hydra.sweeper.n_trials=6")  # the same study: two more trials
    assert len(first.trials) == 4 and len(again.trials) == 6
    assert [t.number for t in again.trials[:4]] == [0, 1, 2, 3] and sorted(again.jobs) == [4, 5]
    assert again.report.count("| COMPLETE |") == 6 and "| trial | state | value |" in again.report
    assert again.results["best_value"] == pytest.approx(min(t.value for t in again.trials))


@pytest.mark.slow
def test_a_config_naming_the_official_class_path_gets_this_sweeper(hydra_sweep_runner, tmp_path):
    """lightning-hydra-template's configs write hydra-optuna-sweeper's `_target_` (not installed here)."""
    swept = sweep_app(hydra_sweep_runner, tmp_path, "hydra.sweeper._target_=hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper")
    assert len(swept.trials) == 8 and swept.results["trials"] == {"COMPLETE": 8}  # curryTrain's results file


def test_a_curry_train_run_calls_no_custom_search_space_outside_the_allow_list(compose_cfg):
    cfg = compose_cfg("sweep=tpe")
    settings, paths, problems = merge_settings(cfg, {"custom_search_space": "os.system"})
    with pytest.raises(ConfigError, match=r"hydra.sweeper.custom_search_space=os.system is not a registered component"):
        check(settings, paths, [], cfg, problems)
