"""MLflow backend (logger=mlflow, `pip install currytrain[mlflow]`): metrics, params, tags and text in an
MLflow tracking store. By default a SQLite store beside the run folder (<run>/../mlflow.db: one database
per day folder or per sweep; a ladder's sub-runs use their ladder's), since MLflow 3 refuses its plain file
store, with artifacts in <run>/../mlartifacts; any tracking URI by override.

A run that belongs to a group is nested under the group's parent run (tag mlflow.parentRunId): a sweep's or
multirun's trials under a parent run the first trial creates for the sweep folder, a ladder's sub-runs under
the ladder's own run. A member's params are its group params (the sampled values) and its config; its tags
say its trial (or job, or sub-run), stage, role and, when it ends, its state (FINISHED, PRUNED, ...).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from filelock import FileLock

from currytrain.journal import flatten
from currytrain.logger.base import RunGroup, journal_tags, read_group, stores_dir
from currytrain.weights import RESOLVED, checkpoint_step, find_checkpoint

log = logging.getLogger(__name__)

MAX_PARAM_CHARS = 6000
"""MLflow's limit on a param value's length (longer values are cut)."""
STATUSES = {"finished": "FINISHED", "pruned": "KILLED", "aborted": "FAILED", "interrupted": "KILLED", "failed": "FAILED"}
"""MLflow's run status per close() status: a trial the sweep pruned and a run a signal stopped are KILLED (not
failures), a run an abort condition stopped is FAILED; a member's tag currytrain.state says which."""
MODEL_NAME = "model"
MODEL_TYPE = "currytrain-dcp-checkpoint"
"""The LoggedModel's type: a torch.distributed.checkpoint folder (its `checkpoint/` artifacts, downloaded, load
with `trainer.init_from=<folder>`) beside the run's resolved.yaml."""
CHECKPOINT_PATH = "checkpoint"
PARENT_TAG = "mlflow.parentRunId"
RUN_DIR_TAG = "currytrain.run_dir"
ARTIFACTS = "mlartifacts"
"""Beside the default store (mlflow.db): the artifact root of the experiments it holds."""
LOCK = ".mlflow.lock"
"""In the group's folder: the trials of a sweep that start together create one parent run, not one each."""


def param_key(key: str) -> str:
    """An override key as an MLflow param key (letters, digits, _ - . / and spaces; + and ~ prefixes dropped)."""
    return re.sub(r"[^\w\-./ ]", "_", key.lstrip("+~"))


def param_text(value: Any) -> str:
    return json.dumps(value, default=str)[:MAX_PARAM_CHARS]


BATCH_METRICS = 1000
"""MLflow's limit on the metrics of one log_batch call."""
FLUSH_SECONDS = 2.0
"""Metrics are written to the store in batches, at least this often, whenever BATCH_METRICS are waiting and when
the run ends: MLflow's SQLite store takes a transaction and about half a millisecond of Python per metric."""


class MLflowLogger:
    deferred = True
    """MultiLogger calls it from its logging thread, off the training loop (logger.base)."""

    def __init__(self, run_dir: str, tracking_uri: str = "", experiment: str = "currytrain", run_name: str = "", log_model: bool = False):
        from mlflow.tracking import MlflowClient  # optional extra, imported only when chosen

        self.run_dir, self.log_model = Path(run_dir), log_model
        self.group = read_group(run_dir)
        stores = stores_dir(run_dir, self.group)
        self.tracking_uri = tracking_uri or f"sqlite:///{stores / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        # Artifacts (stage texts) beside the default store, not in ./mlruns of wherever the command ran.
        artifacts = None if tracking_uri else (stores / ARTIFACTS).as_uri()
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment, artifact_location=artifacts)
        tags = {RUN_DIR_TAG: str(self.run_dir.resolve()), **journal_tags(self.run_dir)}
        self.parent_id = None
        if self.group is not None:
            tags.update(self.group.tag_items())
            if not self.group.is_parent:
                self.parent_id = tags[PARENT_TAG] = self._parent(self.group)
        name = run_name or (self.group.run_name(self.run_dir) if self.group else self.run_dir.name)
        self.run_id = self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id
        self.group_params = {param_key(key): param_text(value) for key, value in (self.group.params if self.group else {}).items()}
        self.pending: list[Any] = []
        self.flushed = time.monotonic()
        self._log_params(self.group_params)

    def _parent(self, group: RunGroup) -> str:
        """The run of the group's folder (the ladder's own run), or one made for it (a sweep's): its id."""
        with FileLock(Path(group.folder) / LOCK):
            runs = self.client.search_runs(
                [self.experiment_id], filter_string=f"tags.`{RUN_DIR_TAG}` = '{group.folder}'", order_by=["attributes.start_time DESC"], max_results=1
            )
            if runs:
                parent = runs[0].info
            else:
                tags = {RUN_DIR_TAG: group.folder, **replace(group, member="", stage="", role="").tag_items()}
                parent = self.client.create_run(self.experiment_id, run_name=group.name, tags=tags).info
            if group.kind != "ladder" and parent.status != "RUNNING":  # a sweep goes on: its parent runs again
                self.client.update_run(parent.run_id, status="RUNNING")
        return parent.run_id

    def _log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(key, value) for key, value in params.items()]
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[start : start + 100])

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
        """The config, flattened, as params; a key the group params already hold (a sampled value) keeps theirs."""
        self._log_params({key: param_text(value) for key, value in flatten(dict(config)).items() if key not in self.group_params})

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        self.client.log_text(self.run_id, text, f"{name.replace('/', '_')}_{step}.txt")

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        pass  # MLflow has no histogram view

    def close(self, status: str = "finished") -> None:
        try:
            self.flush()  # the metrics still waiting, before the run's state changes
            if self.log_model and status == "finished" and not (self.group and self.group.stage):  # a ladder's sub-run keeps no checkpoint
                self._log_model()
            if self.parent_id is not None:
                self.client.set_tag(self.run_id, "currytrain.state", status.upper())
        finally:
            self.client.set_terminated(self.run_id, status=STATUSES.get(status, "FAILED"))
        if self.parent_id is not None and self.group.kind != "ladder":
            self._settle_parent()

    def _log_model(self) -> None:
        """The final checkpoint and resolved.yaml as a LoggedModel of this run (READY once its files are in)."""
        from omegaconf import OmegaConf

        checkpoint = find_checkpoint(self.run_dir)
        if checkpoint is None:
            log.warning("logger.mlflow.log_model: %s holds no complete checkpoint (trainer.checkpoint_every=0?): no model logged", self.run_dir)
            return
        resolved = self.run_dir / RESOLVED
        node = OmegaConf.to_container(OmegaConf.load(resolved).model, resolve=True) if resolved.is_file() else {}
        params = {f"model.{key}": param_text(value) for key, value in flatten(node).items()}
        tags = {RUN_DIR_TAG: str(self.run_dir.resolve()), "currytrain.checkpoint_step": str(checkpoint_step(checkpoint))}
        model = self.client.create_logged_model(self.experiment_id, name=MODEL_NAME, source_run_id=self.run_id, params=params, tags=tags, model_type=MODEL_TYPE)
        self.client.log_model_artifacts(model.model_id, str(checkpoint), artifact_path=CHECKPOINT_PATH)
        if resolved.is_file():  # what rebuilds the model around the weights
            self.client.log_model_artifact(model.model_id, str(resolved))
        self.client.finalize_logged_model(model.model_id, "READY")

    def _settle_parent(self) -> None:
        """A sweep's parent run ends when none of its trials is still running (a later trial runs it again)."""
        running = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{self.parent_id}' and attributes.status = 'RUNNING'", max_results=1
        )
        if not running:
            self.client.set_terminated(self.parent_id, status="FINISHED")
