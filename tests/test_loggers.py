"""Tracking backends, read back from their real stores: TensorBoard event files, an MLflow SQLite store
through mlflow's own client, and W&B's offline transaction log."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from conftest import launch
from currytrain.journal import read_journal

pytestmark = pytest.mark.filterwarnings("ignore")


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
def test_mlflow_store_holds_metrics_params_tags_and_status(tmp_path):
    from mlflow.tracking import MlflowClient

    run_dir = _run(tmp_path, "mlflow")
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


@pytest.mark.slow
def test_a_failed_run_is_marked_failed_in_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    result = launch("logger=[mlflow]", "model.init_std=1e38", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 4, result.stderr[-2000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("currytrain").experiment_id])
    assert run.info.status == "FAILED"


def _wandb_history(run_dir: Path) -> dict[int, dict]:
    """History rows of W&B's offline transaction log: a LevelDB-style log of protobuf Records (7-byte file
    header, 32 KiB blocks, each chunk with a 7-byte header: crc32c, length, type FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, position, pending, rows = path.read_bytes(), 7, b"", {}
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
