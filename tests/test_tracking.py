"""Sweeps, multiruns and ladders as the trackers show them, read back through each tracker's own client: one
3-trial sweep (one trial pruned, the best config confirmed at 2 fresh seeds) with every backend on, read by TensorBoard's HParams plugin, MLflow's client,
W&B's offline transaction log and Aim's Repo; a multirun without a sweeper; a ladder's sub-runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from conftest import launch
from currytrain.logger.base import read_group
from currytrain.sweep.study import open_storage
from tests.test_loggers import HAS_AIM, aim_repo, needs_aim, wandb_records

pytestmark = pytest.mark.filterwarnings("ignore")

LOGGERS = ["tensorboard", "mlflow", "wandb", *(["aim"] if HAS_AIM else []), "jsonl"]
INIT_STDS = (0.02, 0.03, 2.0)
"""The sweep's grid: init_std=2.0 starts at a val loss near 30, which the ThresholdPruner (upper 8) prunes at step 3."""
SWEEP = (
    "-m",
    "sweep=grid",
    "sweep.n_trials=3",
    "optimizer.lr=0.003",
    f"model.init_std=choice({','.join(map(str, INIT_STDS))})",
    "sweep.pruner._target_=optuna.pruners.ThresholdPruner",
    "sweep.pruner.upper=8.0",
    "sweep.confirm_top_k=1",
    "sweep.confirm_seeds=2",
)
CONFIRM_SEEDS = (1, 2)
"""The confirmation seeds: the ones right after the sweep's seed (0)."""


@dataclass
class Sweep:
    dir: Path
    trials: list[optuna.trial.FrozenTrial]

    def run_dir(self, trial) -> Path:
        return self.dir / str(trial.number)

    @property
    def best(self) -> optuna.trial.FrozenTrial:
        return min((t for t in self.trials if t.state.name == "COMPLETE"), key=lambda t: t.value)

    @property
    def confirm_dirs(self) -> dict[int, Path]:
        """The best config's confirmation runs, by seed."""
        return {seed: self.dir / "confirm" / f"trial_{self.best.number}" / f"seed_{seed}" for seed in CONFIRM_SEEDS}


def jsonl_curve(run_dir: Path, name: str) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[name] for r in records if name in r}


def mlflow_runs(store: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    return client, client.search_runs([client.get_experiment_by_name("currytrain").experiment_id])


def wandb_run_record(run_dir: Path):
    """(the run record: group, job_type, name, config; the summary's last values) of a W&B offline run."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    run, summary = None, {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "summary":
            summary.update({item.key: json.loads(item.value_json) for item in record.summary.update})
    return run, summary


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Sweep:
    sweep_dir = tmp_path_factory.mktemp("tracking") / "sweep"
    result = launch(*SWEEP, f"logger=[{','.join(LOGGERS)}]", f"hydra.sweep.dir={sweep_dir}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    trials = optuna.load_study(study_name="grid", storage=open_storage(f"sqlite:///{sweep_dir / 'optuna.db'}")).trials
    assert sorted(t.params["model.init_std"] for t in trials) == list(INIT_STDS)
    assert [t.params["model.init_std"] for t in trials if t.state.name == "PRUNED"] == [2.0]  # the others complete
    sweep = Sweep(sweep_dir.resolve(), trials)
    assert all((path / "metrics.jsonl").is_file() for path in sweep.confirm_dirs.values())
    return sweep


def test_each_trial_journals_its_group_with_the_sampled_values_only(sweep):
    for trial in sweep.trials:
        group = read_group(sweep.run_dir(trial))
        assert (group.kind, group.folder, group.member, group.job_type) == ("sweep", str(sweep.dir), str(trial.number), "trial")
        assert group.params == trial.params  # not the fixed overrides (optimizer.lr=0.003, TINY's)
        assert group.tags == {"study": "grid"}
    for seed, run_dir in sweep.confirm_dirs.items():  # the confirmation runs: members of the sweep too
        group = read_group(run_dir)
        assert (group.kind, group.folder, group.member, group.job_type, group.role) == (
            "sweep",
            str(sweep.dir),
            f"confirm/trial_{sweep.best.number}/seed_{seed}",
            "confirm",
            "confirm",
        )
        assert group.params == {**sweep.best.params, "seed": seed}
        assert group.tags == {"study": "grid", "confirms_trial": str(sweep.best.number)}


def _session_groups(logdir: Path):
    """What TensorBoard's HParams dashboard lists for `tensorboard --logdir <logdir>`: the plugin's own
    ListSessionGroups over the event files, every status allowed."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    backend = backend_context.Context(base_plugin.TBContext(logdir=str(logdir), multiplexer=multiplexer, data_provider=provider))
    statuses = [api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE, api_pb2.STATUS_RUNNING]
    request = api_pb2.ListSessionGroupsRequest(start_index=0, slice_size=100, allowed_statuses=statuses, include_metrics=True)
    return list(list_session_groups.Handler(context.RequestContext(), backend, "", request).run().session_groups)


def test_tensorboard_hparams_dashboard_shows_the_sweep(sweep):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, metadata

    for trial in sweep.trials:  # each trial's event files: its sampled values, and how it ended
        events = EventAccumulator(str(sweep.run_dir(trial) / "tb"), size_guidance={"tensors": 0}).Reload()
        start = metadata.parse_session_start_info_plugin_data(events.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content)
        end = metadata.parse_session_end_info_plugin_data(events.SummaryMetadata(metadata.SESSION_END_INFO_TAG).plugin_data.content)
        assert {name: value.number_value for name, value in start.hparams.items()} == trial.params
        assert end.status == (api_pb2.STATUS_SUCCESS if trial.state.name == "COMPLETE" else api_pb2.STATUS_UNKNOWN)
    rows = _session_groups(sweep.dir)
    groups = {group.hparams["model.init_std"].number_value: group for group in rows if "seed" not in group.hparams}
    assert set(groups) == set(INIT_STDS) and len(rows) == len(INIT_STDS) + len(CONFIRM_SEEDS)  # one row per trial, and per confirmation run
    confirming = {int(group.hparams["seed"].number_value): group for group in rows if "seed" in group.hparams}
    assert sorted(confirming) == list(CONFIRM_SEEDS)
    for seed, group in confirming.items():
        assert group.hparams["model.init_std"].number_value == sweep.best.params["model.init_std"]
        metrics = {value.name.tag: value.value for value in group.metric_values}
        val_curve = jsonl_curve(sweep.confirm_dirs[seed], "val/loss")
        assert metrics["val/loss"] == pytest.approx(val_curve[max(val_curve)], rel=1e-6)
    for trial in sweep.trials:
        group = groups[trial.params["model.init_std"]]
        metrics = {value.name.tag: value.value for value in group.metric_values}
        val_curve = jsonl_curve(sweep.run_dir(trial), "val/loss")
        assert metrics["val/loss"] == pytest.approx(val_curve[max(val_curve)], rel=1e-6)  # the final (or pruned-at) value
        if trial.state.name == "COMPLETE":
            assert metrics["val/loss"] == pytest.approx(trial.value, rel=1e-6)
        else:
            assert max(val_curve) == 3  # pruned at its first eval


def test_mlflow_nests_the_trials_under_the_sweeps_parent_run(sweep):
    client, runs = mlflow_runs(sweep.dir)
    (parent,) = [run for run in runs if run.data.tags["currytrain.run_dir"] == str(sweep.dir)]
    nested = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    children = {int(run.data.tags["currytrain.trial"]): run for run in nested if "currytrain.trial" in run.data.tags}
    assert len(runs) == 1 + len(sweep.trials) + len(CONFIRM_SEEDS) and len(nested) == len(runs) - 1
    assert sorted(children) == [t.number for t in sweep.trials]
    confirming = {run.data.tags["currytrain.run_dir"]: run for run in nested if run.data.tags.get("currytrain.role") == "confirm"}
    for seed, run_dir in sweep.confirm_dirs.items():
        run = confirming[str(run_dir)]
        assert run.info.run_name == f"confirm/trial_{sweep.best.number}/seed_{seed}" and run.data.params["seed"] == str(seed)
        assert run.data.params["model.init_std"] == json.dumps(sweep.best.params["model.init_std"])
        assert (run.data.tags["currytrain.confirms_trial"], run.data.tags["currytrain.state"]) == (str(sweep.best.number), "FINISHED")
    assert parent.info.status == "FINISHED" and parent.data.tags["currytrain.group_kind"] == "sweep" and parent.data.tags["currytrain.study"] == "grid"
    for trial in sweep.trials:
        child = children[trial.number]
        assert child.data.params["model.init_std"] == json.dumps(trial.params["model.init_std"])
        assert child.data.params["optimizer.lr"] == "0.003"  # the config beside the sampled values
        state = {"COMPLETE": "FINISHED", "PRUNED": "PRUNED"}[trial.state.name]
        assert child.data.tags["currytrain.state"] == state
        assert child.info.status == {"FINISHED": "FINISHED", "PRUNED": "KILLED"}[state]
        assert child.info.run_name == str(trial.number) and child.data.tags["currytrain.run_dir"] == str(sweep.run_dir(trial))


def test_wandb_offline_runs_of_the_sweep_are_one_group(sweep):
    for trial in sweep.trials:
        run, summary = wandb_run_record(sweep.run_dir(trial))
        assert run.run_group == str(sweep.dir) and run.job_type == "trial"
        config = {item.key: json.loads(item.value_json) for item in run.config.update}
        assert config["run_group"]["params"] == trial.params and config["run_group"]["member"] == str(trial.number)
        assert summary["state"] == {"COMPLETE": "finished", "PRUNED": "pruned"}[trial.state.name]
    for seed, run_dir in sweep.confirm_dirs.items():
        run, summary = wandb_run_record(run_dir)
        config = {item.key: json.loads(item.value_json) for item in run.config.update}
        assert (run.run_group, run.job_type, summary["state"]) == (str(sweep.dir), "confirm", "finished")
        assert config["run_group"]["params"] == {**sweep.best.params, "seed": seed}


@needs_aim
def test_aim_runs_of_the_sweep_share_one_experiment_and_hold_the_curves(sweep):
    from aim.storage.context import Context

    repo = aim_repo(sweep.dir)
    runs = {run.get("run_dir"): run for run in (repo.get_run(run_hash) for run_hash in repo.list_all_runs())}
    assert set(runs) == {str(sweep.run_dir(trial)) for trial in sweep.trials} | {str(path) for path in sweep.confirm_dirs.values()}
    assert {run.experiment for run in runs.values()} == {str(sweep.dir)}
    for trial in sweep.trials:
        run = runs[str(sweep.run_dir(trial))]
        assert run["group"]["params"] == trial.params and run["hparams"]["model"]["init_std"] == trial.params["model.init_std"]
        assert run["status"] == {"COMPLETE": "finished", "PRUNED": "pruned"}[trial.state.name]
        assert run["journal"]["seed"] == 0 and run["journal"]["type"] == "header"
        for tag in ("train/loss", "val/loss"):  # same steps, same values as metrics.jsonl
            subset, _, name = tag.partition("/")
            frame = run.get_metric(name, Context({"subset": subset})).dataframe()
            assert dict(zip(frame["step"], frame["value"])) == pytest.approx(jsonl_curve(sweep.run_dir(trial), tag), rel=1e-6)


def test_a_multirun_without_a_sweeper_is_grouped_by_its_swept_values(tmp_path):
    """-m seed=1,2 with Hydra's own sweeper: each job's group holds the swept value alone (not TINY's fixed
    overrides), and TensorBoard's HParams dashboard lists the jobs by it (the other backends read the same group)."""
    sweep_dir = tmp_path / "multirun"
    result = launch("-m", "seed=1,2", "logger=[tensorboard,jsonl]", f"hydra.sweep.dir={sweep_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    groups = [read_group(sweep_dir / str(job)) for job in (0, 1)]
    assert [(g.kind, g.member, g.job_type, g.params) for g in groups] == [("multirun", "0", "job", {"seed": 1}), ("multirun", "1", "job", {"seed": 2})]
    assert {(g.folder, g.stores) for g in groups} == {(str(sweep_dir.resolve()), str(sweep_dir.resolve()))}
    rows = {int(group.hparams["seed"].number_value): group for group in _session_groups(sweep_dir)}
    assert sorted(rows) == [1, 2] and all(len(row.sessions) == 1 for row in rows.values())


@pytest.mark.slow
def test_a_ladder_shows_its_sub_runs_nested_in_mlflow_and_grouped_in_wandb_and_aim(tmp_path):
    run_dir = tmp_path / "ladder"
    loggers = ["mlflow", "wandb", *(["aim"] if HAS_AIM else [])]
    result = launch("check=seeds", "check.stages.seeds.seeds=2", "check.stages.seeds.max_steps=3", f"logger=[{','.join(loggers)}]", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    ladder_dir, subruns = run_dir.resolve(), {"seeds/seed_0": "seed_0", "seeds/seed_1": "seed_1"}

    client, runs = mlflow_runs(tmp_path)
    (ladder,) = [run for run in runs if run.data.tags["currytrain.run_dir"] == str(ladder_dir)]
    assert [artifact.path for artifact in client.list_artifacts(ladder.info.run_id)] == ["check_seeds_0.txt"]  # the stage's verdicts
    assert ladder.info.artifact_uri.startswith((tmp_path / "mlartifacts").resolve().as_uri())  # beside the store, not in ./mlruns
    children = {run.info.run_name: run for run in runs if run.data.tags.get("mlflow.parentRunId") == ladder.info.run_id}
    assert len(runs) == 3 and set(children) == set(subruns)
    for name, role in subruns.items():
        tags = children[name].data.tags
        assert (tags["currytrain.stage"], tags["currytrain.role"], tags["currytrain.state"]) == ("seeds", role, "FINISHED")
        assert children[name].data.params["seed"] == role[-1] and children[name].data.params["trainer.max_steps"] == "3"
    assert ladder.data.tags["currytrain.role"] == "ladder" and "mlflow.parentRunId" not in ladder.data.tags

    group = str(ladder_dir)  # the ladder's folder, absolute outside the working directory
    own, _ = wandb_run_record(ladder_dir)
    assert (own.run_group, own.job_type) == (group, "ladder")
    for name in subruns:
        run, summary = wandb_run_record(ladder_dir / name)
        assert (run.run_group, run.job_type, run.display_name, summary["state"]) == (group, "seeds", name, "finished")

    if HAS_AIM:
        repo = aim_repo(tmp_path)
        aim_runs = {run.name: run for run in (repo.get_run(run_hash) for run_hash in repo.list_all_runs())}
        assert set(aim_runs) == {"ladder", *subruns} and {run.experiment for run in aim_runs.values()} == {group}
        assert [(aim_runs[name]["group"]["stage"], aim_runs[name]["group"]["role"]) for name in sorted(subruns)] == [("seeds", "seed_0"), ("seeds", "seed_1")]
