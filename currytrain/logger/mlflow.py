"""MLflow backend (logger=mlflow, `pip install currytrain[mlflow]`): metrics, params, tags and text in an
MLflow tracking store. By default a SQLite store beside the run folder (<run>/../mlflow.db: one database
per day folder or per sweep), since MLflow 3 refuses its plain file store; any tracking URI by override."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from currytrain.journal import flatten
from currytrain.logger.base import journal_tags

MAX_PARAM_CHARS = 6000
"""MLflow's limit on a param value's length (longer values are cut)."""
BATCH_METRICS = 1000
"""MLflow's limit on the metrics of one log_batch call."""
FLUSH_SECONDS = 2.0
"""Metrics are written to the store in batches by a thread of their own, at least this often and whenever
BATCH_METRICS are waiting, and the rest when the run ends: MLflow's store takes about half a millisecond of
Python per metric, which written from the training loop cost a small model more than its step."""
STATUSES = {"finished": "FINISHED", "failed": "FAILED"}


class MLflowLogger:
    def __init__(self, run_dir: str, tracking_uri: str = "", experiment: str = "currytrain", run_name: str = ""):
        from mlflow.tracking import MlflowClient  # optional extra, imported only when chosen

        self.run_dir = Path(run_dir)
        self.tracking_uri = tracking_uri or f"sqlite:///{self.run_dir.resolve().parent / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        tags = {"currytrain.run_dir": str(self.run_dir.resolve()), **journal_tags(self.run_dir)}
        self.run_id = self.client.create_run(experiment_id, run_name=run_name or self.run_dir.name, tags=tags).info.run_id
        self.pending: list[Any] = []
        self.lock = threading.Lock()
        self.wake, self.stopping = threading.Event(), False
        self.error: BaseException | None = None
        self.writer = threading.Thread(target=self._write_in_background, name="mlflow-metrics", daemon=True)
        self.writer.start()

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        if self.error is not None:  # the store refused a batch: the run learns of it at its next log
            raise self.error
        stamp = int(time.time() * 1000)
        with self.lock:
            self.pending += [Metric(name, float(value), stamp, step) for name, value in metrics.items()]
            if len(self.pending) >= BATCH_METRICS:
                self.wake.set()

    def _write_in_background(self) -> None:
        while not self.stopping:
            self.wake.wait(FLUSH_SECONDS)
            self.wake.clear()
            try:
                self.flush()
            except Exception as error:  # kept for the training thread to raise
                self.error = error
                return

    def flush(self) -> None:
        """Write the metrics logged since the last flush, in batches of MLflow's size."""
        with self.lock:
            pending, self.pending = self.pending, []
        for start in range(0, len(pending), BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=pending[start : start + BATCH_METRICS])

    def log_config(self, config: Mapping) -> None:
        from mlflow.entities import Param

        params = [Param(key, json.dumps(value, default=str)[:MAX_PARAM_CHARS]) for key, value in flatten(dict(config)).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        self.client.log_text(self.run_id, text, f"{name.replace('/', '_')}_{step}.txt")

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        pass  # MLflow has no histogram view

    def close(self, status: str = "finished") -> None:
        self.stopping = True
        self.wake.set()
        self.writer.join()
        try:
            if self.error is not None:
                raise self.error
            self.flush()
        finally:
            self.client.set_terminated(self.run_id, status=STATUSES.get(status, "FAILED"))
