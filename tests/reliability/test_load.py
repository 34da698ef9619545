"""Load: a run that logs every step at full speed for 10,000 steps with every logger on, and a 50-trial sweep of
tiny trials, keep their journals, metrics and trackers complete (every record counted in every store). The step
time these loggers cost is measured by bench/logger_load.py (`make reliability` shows both)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from test_loggers import _wandb_history

from conftest import launch
from currytrain.journal import read_journal
from currytrain.sweep.study import open_storage

pytestmark = pytest.mark.filterwarnings("ignore")

ALL = "logger=[tensorboard,jsonl,mlflow,wandb]"
SMALL = ("model.dim=16", "model.n_heads=1", "model.mlp_hidden=32", "model.max_seq_len=16", "trainer.batch_size=2", "data.max_bytes=300000")
"""A model small enough that the loop, not the matmuls, sets the pace: logging every step weighs the most."""


def tensorboard_steps(folder: Path, tag: str = "train/loss") -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    return [event.step for event in EventAccumulator(str(folder), size_guidance={"scalars": 0}).Reload().Scalars(tag)]


def mlflow_histories(store: Path, tag: str = "train/loss", parent: str | None = None) -> dict[str, list[int]]:
    """Each MLflow run's logged steps of `tag`, by run name; with `parent`, the runs nested under the run of that
    name (a sweep's trials under the sweep's parent run), after checking that every other run is nested there."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    runs = client.search_runs([client.get_experiment_by_name("currytrain").experiment_id], max_results=1000)
    if parent is not None:
        (group,) = [run for run in runs if run.info.run_name == parent]
        runs = [run for run in runs if run is not group]
        assert all(run.data.tags.get("mlflow.parentRunId") == group.info.run_id for run in runs), "every trial nested under the sweep's run"
    return {run.info.run_name: sorted(m.step for m in client.get_metric_history(run.info.run_id, tag)) for run in runs}


def jsonl_steps(run_dir: Path, tag: str = "train/loss") -> list[int]:
    return [record["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if tag in (record := json.loads(line))]


@pytest.mark.load
@pytest.mark.reliability(kind="load", case="10,000 steps, every step logged, every logger on")
def test_ten_thousand_steps_logged_every_step_by_every_logger_are_all_kept(tmp_path, record_property):
    run_dir, steps = tmp_path / "run", 10_000
    started = time.perf_counter()
    result = launch(
        *SMALL, ALL, f"trainer.max_steps={steps}", "trainer.log_every=1", "trainer.eval_every=5000", "trainer.eval_batches=1", f"hydra.run.dir={run_dir}"
    )
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]
    every = list(range(1, steps + 1))
    records = read_journal(run_dir / "journal.jsonl")
    counts = {
        "journal": sorted(r["step"] for r in records if r["type"] == "metrics"),
        "metrics.jsonl": jsonl_steps(run_dir),
        "tensorboard": sorted(tensorboard_steps(run_dir / "tb")),
        "mlflow": mlflow_histories(tmp_path / "mlflow.db")["run"],
        "wandb": sorted(step for step, row in _wandb_history(run_dir).items() if "train/loss" in row),
    }
    for store, logged in counts.items():
        assert logged == every, f"{store} holds {len(logged)} of {steps} steps"
    record_property("records", {store: len(logged) for store, logged in counts.items()})
    record_property("seconds", round(seconds))
    record_property("ms_per_step", round(1e3 * statistics.median(r["train/step_seconds"] for r in records if r["type"] == "metrics"), 2))


@pytest.mark.load
@pytest.mark.reliability(kind="load", case="a 50-trial sweep of tiny trials, every logger on")
def test_a_fifty_trial_sweep_keeps_every_trials_journal_metrics_and_trackers(tmp_path, record_property):
    sweep_dir, trials, steps = tmp_path / "sweep", 50, 2
    started = time.perf_counter()
    result = launch(
        "-m", "sweep=random", f"sweep.n_trials={trials}", *SMALL, ALL, f"trainer.max_steps={steps}", "trainer.eval_every=2", "trainer.eval_batches=1",
        "optimizer.schedule.warmup_steps=1", f"hydra.sweep.dir={sweep_dir}", timeout=1800,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]
    study = optuna.load_study(study_name="random", storage=open_storage(f"sqlite:///{sweep_dir / 'optuna.db'}"))
    assert sorted(t.number for t in study.trials) == list(range(trials)) and all(t.state == TrialState.COMPLETE for t in study.trials)
    histories = mlflow_histories(sweep_dir / "mlflow.db", parent=str(sweep_dir))
    assert sorted(histories) == sorted(str(n) for n in range(trials)), "one MLflow run per trial, under the sweep's"
    every = list(range(1, steps + 1))
    for number in range(trials):
        run_dir = sweep_dir / str(number)
        types = [r["type"] for r in read_journal(run_dir / "journal.jsonl")]
        assert types[0] == "header" and types.count("start") == 1 and types[-1] == "finish", (number, types)
        assert jsonl_steps(run_dir) == every and sorted(tensorboard_steps(run_dir / "tb")) == every and histories[str(number)] == every
        assert sorted(step for step, row in _wandb_history(run_dir).items() if "train/loss" in row) == every
    record_property(
        "records",
        {
            "trials": trials,
            "journals": trials,
            "metrics.jsonl": trials * steps,
            "tensorboard": trials * steps,
            "mlflow": trials * steps,
            "wandb": trials * steps,
        },
    )
    record_property("seconds", round(seconds))
