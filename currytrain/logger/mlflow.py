"""MLflow backend (logger=mlflow, `pip install currytrain[mlflow]`): metrics, params, tags and text in an
MLflow tracking store. By default a SQLite store beside the run folder (<run>/../mlflow.db: one database
per day folder or per sweep), since MLflow 3 refuses its plain file store; any tracking URI by override."""

from __future__ import annotations

import json
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
"""Metrics are written to the store in batches, at least this often, whenever BATCH_METRICS are waiting and when
the run ends: MLflow's SQLite store takes a transaction and about half a millisecond of Python per metric."""
STATUSES = {"finished": "FINISHED", "failed": "FAILED"}


class MLflowLogger:
    deferred = True
    """MultiLogger calls it from its logging thread, off the training loop (logger.base)."""

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
        self.flushed = time.monotonic()

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        self.pending += [Metric(name, float(value), stamp, step) for name, value in metrics.items()]
        if len(self.pending) >= BATCH_METRICS or time.monotonic() - self.flushed > FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write the metrics logged since the last flush, in batches of MLflow's size."""
        pending, self.pending, self.flushed = self.pending, [], time.monotonic()
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
        try:
            self.flush()
        finally:
            self.client.set_terminated(self.run_id, status=STATUSES.get(status, "FAILED"))
