"""Tracking backends, read back from their real stores: TensorBoard event files, an MLflow SQLite store
through mlflow's own client, and W&B's offline transaction log."""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import launch
from currytrain.journal import read_journal

pytestmark = pytest.mark.filterwarnings("ignore")

HAS_AIM = importlib.util.find_spec("aim") is not None
needs_aim = pytest.mark.skipif(not HAS_AIM, reason="aim is not installed (currytrain[aim]: Python 3.10-3.12)")


def aim_repo(path: Path):
    """Aim's Repo at `path`, after rebuilding its index as `aim up` does (Aim lists new runs at once, but its
    queries and get_run see them only once indexed)."""
    from aim import Repo

    aim = Path(sys.executable).parent / "aim"
    subprocess.run([str(aim), "storage", "--repo", str(path), "reindex", "--yes"], check=True, capture_output=True, timeout=120)
    return Repo(str(path))


def _jsonl_curve(run_dir: Path, name: str = "train/loss") -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[name] for r in records if name in r}


def _run(tmp_path: Path, loggers: str, *overrides: str) -> Path:
    run_dir = tmp_path / "run"
    result = launch(f"logger=[{loggers},jsonl]", f"hydra.run.dir={run_dir}", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_tensorboard_holds_the_curves_the_config_and_histograms(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = _run(tmp_path, "tensorboard")
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    curve = {event.step: event.value for event in events.Scalars("train/loss")}
    assert curve.keys() == _jsonl_curve(run_dir).keys() == set(range(1, 7))
    assert all(curve[step] == pytest.approx(value, rel=1e-6) for step, value in _jsonl_curve(run_dir).items())
    assert {"config/text_summary", "journal_header/text_summary"} <= set(events.Tags()["tensors"])


def test_a_resume_replaces_the_re_run_steps_in_tensorboard_and_metrics_jsonl(tmp_path):
    """A run logged steps 1-5, died, and resumed from its step-2 checkpoint: the store readers see steps
    3-5 once, with the re-run's values (TensorBoard through purge_step, metrics.jsonl rewritten)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from currytrain.logger.jsonl import JsonlLogger
    from currytrain.logger.tensorboard import TensorBoardLogger

    for make in (lambda: TensorBoardLogger(str(tmp_path), flush_secs=1), lambda: JsonlLogger(str(tmp_path))):
        first = make()
        for step in range(1, 6):
            first.log_metrics({"train/loss": float(step)}, step)
        first.close("failed")
        second = make()
        second.restarted(2)
        for step in range(3, 7):
            second.log_metrics({"train/loss": 10.0 * step}, step)
        second.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0}).Reload()
    expected = [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0), (6, 60.0)]
    assert [(event.step, event.value) for event in events.Scalars("train/loss")] == expected
    assert sorted(_jsonl_curve(tmp_path).items()) == expected


def test_tensorboard_logger_writes_histograms_and_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from currytrain.logger.tensorboard import TensorBoardLogger

    logger = TensorBoardLogger(str(tmp_path))
    logger.log_histogram("grads/layer0", [0.1, 0.2, 0.2, 5.0], step=3)
    logger.log_text("note", "hello", step=3)
    logger.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"histograms": 0, "tensors": 0}).Reload()
    (histogram,) = events.Histograms("grads/layer0")
    assert histogram.step == 3 and histogram.histogram_value.num == 4 and histogram.histogram_value.max == 5.0
    assert "note/text_summary" in events.Tags()["tensors"]


@pytest.mark.slow
def test_mlflow_store_holds_metrics_params_tags_status_and_the_model(tmp_path):
    from mlflow.tracking import MlflowClient

    run_dir = _run(tmp_path, "mlflow", "logger.mlflow.log_model=true")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("currytrain").experiment_id])
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}
    expected = _jsonl_curve(run_dir)
    assert history.keys() == expected.keys() and all(history[s] == pytest.approx(v, rel=1e-6) for s, v in expected.items())
    val = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/loss")}
    finish = [e for e in read_journal(run_dir / "journal.jsonl") if e["type"] == "finish"][0]
    assert val[6] == pytest.approx(finish["val_loss"], rel=1e-6)
    assert run.data.params["optimizer.lr"] == "0.003" and run.data.params["model.dim"] == "32"
    header = read_journal(run_dir / "journal.jsonl")[0]
    assert run.data.tags["currytrain.git_sha"] == str(header["git_sha"]) and run.data.tags["currytrain.seed"] == "0"
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    # logger.mlflow.log_model=true: the final checkpoint as a LoggedModel of the run, its files as written
    (model,) = client.search_logged_models(experiment_ids=[run.info.experiment_id])
    assert (model.source_run_id, str(model.status)) == (run.info.run_id, "READY")
    assert model.params["model.dim"] == "32" and model.tags["currytrain.checkpoint_step"] == "6"
    logged = {artifact.path for artifact in client.list_logged_model_artifacts(model.model_id)}
    step_dir = run_dir / "checkpoints" / "step_6"
    assert {"resolved.yaml", "checkpoint"} <= logged
    assert {a.path for a in client.list_logged_model_artifacts(model.model_id, "checkpoint")} == {f"checkpoint/{p.name}" for p in step_dir.iterdir()}


@pytest.mark.slow
def test_a_failed_run_is_marked_failed_in_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    result = launch("logger=[mlflow]", "model.init_std=1e38", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 4, result.stderr[-2000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("currytrain").experiment_id])
    assert run.info.status == "FAILED"


def wandb_records(path: Path):
    """The protobuf Records of a W&B offline transaction log (run-*.wandb), read with wandb's own protobufs: a
    LevelDB-style log (7-byte file header, 32 KiB blocks, each chunk with a 7-byte header: crc32c, length, type
    FULL/FIRST/MIDDLE/LAST). wandb 0.31 reads it in its Go core and no longer ships a Python reader."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, position, pending = path.read_bytes(), 7, b""
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # too little room left in the block for a header: padding
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk, position = data[position + 7 : position + 7 + length], position + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def _wandb_history(run_dir: Path) -> dict[int, dict]:
    """History rows of the run's W&B offline transaction log, by step."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    rows = {}
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows[row["_step"]] = row
    return rows


@pytest.mark.slow
def test_wandb_offline_files_hold_the_curves(tmp_path):
    run_dir = _run(tmp_path, "wandb")
    history = _wandb_history(run_dir)
    expected = _jsonl_curve(run_dir)
    assert {step for step, row in history.items() if "train/loss" in row} == expected.keys()
    assert all(history[step]["train/loss"] == pytest.approx(value, rel=1e-6) for step, value in expected.items())
    assert history[6]["val/loss"] == pytest.approx(_jsonl_curve(run_dir, "val/loss")[6], rel=1e-6)


def test_a_missing_extra_is_a_config_error_naming_it(compose_cfg, monkeypatch):
    import importlib.util

    from currytrain.validate import validate

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "mlflow" else real(name, *args))
    problems = validate(compose_cfg("logger=[mlflow]"))
    assert problems == ["logger.mlflow needs the mlflow package, which is not installed: pip install 'currytrain[mlflow]' (or choose another logger)"]


@needs_aim
def test_aim_holds_curves_in_contexts_texts_histograms_and_how_the_run_ended(tmp_path):
    """Straight through AimLogger: a run on its own goes to the configured experiment; a relaunch into the same
    folder (a resume) continues the same Aim run, and a re-run step's value replaces the earlier one."""
    from aim.storage.context import Context

    from currytrain.logger.aim import AimLogger

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = AimLogger(str(run_dir))
    first.log_config({"optimizer": {"lr": 0.1}})
    for step in range(1, 5):
        first.log_metrics({"train/loss": float(step), "memory/peak_bytes": 10.0 * step}, step)
    first.log_metrics({"val/loss": 0.5}, 4)
    first.log_text("check/seeds", "passed: 3 seeds", 0)
    first.log_histogram("check/weight/0", [0.1, 0.2, 0.2, 5.0], 2)
    first.close("failed")
    again = AimLogger(str(run_dir))
    again.log_metrics({"train/loss": 30.0}, 3)
    again.close()

    repo = aim_repo(tmp_path)
    (run_hash,) = repo.list_all_runs()
    run = repo.get_run(run_hash)
    assert (run.experiment, run.name, run["status"], run["hparams"], run.tags) == ("currytrain", "run", "finished", {"optimizer": {"lr": 0.1}}, [])

    def curve(name: str, context: dict) -> dict:
        frame = run.get_metric(name, Context(context)).dataframe()
        return dict(zip(frame["step"], frame["value"]))

    assert curve("loss", {"subset": "train"}) == {1: 1.0, 2: 2.0, 3: 30.0, 4: 4.0}
    assert curve("loss", {"subset": "val"}) == {4: 0.5} and curve("memory/peak_bytes", {})[4] == 40.0
    (text,) = run.get_text_sequence("check/seeds", Context({})).values.values_list()
    (histogram,) = run.get_distribution_sequence("check/weight/0", Context({})).values.values_list()
    counts, edges = histogram.to_np_histogram()
    assert text.data == "passed: 3 seeds" and counts.sum() == 4 and edges[0] == pytest.approx(0.1) and edges[-1] == pytest.approx(5.0)


def test_logger_aim_on_a_python_aim_has_no_release_for_exits_2_naming_the_extra(tmp_path, monkeypatch):
    import currytrain.logger.config as logger_config

    monkeypatch.setattr(logger_config, "AIM_PYTHONS", ((3, 0), (3, 1)))  # as if this Python were past aim's last
    result = launch("logger=[aim]", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2
    assert "logger.aim needs the aim package, which has no release for Python" in result.stderr and "currytrain[aim]" in result.stderr
    assert not (tmp_path / "run").exists()


def test_logger_aim_without_its_extra_is_a_config_error_naming_it(compose_cfg, monkeypatch):
    from currytrain.validate import validate

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "aim" else real(name, *args))
    problems = validate(compose_cfg("logger=[aim]"))
    assert problems == ["logger.aim needs the aim package, which is not installed: pip install 'currytrain[aim]' (or choose another logger)"]


def test_close_statuses_say_how_the_run_ended():
    from currytrain.errors import Aborted, Interrupted, Pruned, RunFailed
    from currytrain.logger.base import ending_status

    errors = [Pruned("p"), Aborted("a"), Interrupted("i", 15), KeyboardInterrupt(), RunFailed("f"), ValueError("v")]
    assert [ending_status(error) for error in errors] == ["pruned", "aborted", "interrupted", "interrupted", "failed", "failed"]
