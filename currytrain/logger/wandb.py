"""Weights & Biases backend (logger=wandb, `pip install currytrain[wandb]`). mode=offline (the default)
needs no account and writes <run>/wandb/offline-run-*/ (upload later with `wandb sync`); mode=online
logs to the user's W&B account.

A run that belongs to a group joins W&B's group of that name (the sweep's folder, the ladder's run) with
job_type trial, job, its ladder stage, or ladder for the ladder's own run; its group params (the sampled
values) go to the config under `run_group.params`, beside the resolved config. The summary's `state` says
how the run ended (finished, pruned, aborted, interrupted, failed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from currytrain.logger.base import journal_tags, read_group

MAX_GROUP_CHARS = 128
"""W&B's limit on a group's and a job_type's length: a longer name keeps its end (the folder's own name)."""


class WandbLogger:
    deferred = True
    """MultiLogger calls it from its logging thread, off the training loop (logger.base)."""

    def __init__(self, run_dir: str, project: str = "currytrain", entity: str = "", mode: str = "offline", run_name: str = ""):
        import wandb  # optional extra, imported only when chosen

        self.wandb = wandb
        run_dir_path = Path(run_dir)
        group = read_group(run_dir_path)
        # create_new: a ladder's sub-runs start while its own run is still open (the default would finish it).
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, reinit="create_new")
        facts = {**journal_tags(run_dir_path), **(group.tag_items() if group else {})}
        facts.pop("currytrain.group", None)  # the group itself says it
        self.run = wandb.init(
            project=project,
            entity=entity or None,
            mode=mode,
            name=run_name or (group.run_name(run_dir_path) if group else run_dir_path.name),
            dir=str(run_dir_path),
            group=group.name[-MAX_GROUP_CHARS:] if group else None,
            job_type=group.job_type[-MAX_GROUP_CHARS:] if group and group.job_type else None,
            tags=[f"{key}={value}"[:64] for key, value in facts.items() if "version" not in key],
            config={"run_group": {"kind": group.kind, "member": group.member, "role": group.role, "params": group.params}} if group else None,
            settings=settings,
        )
        self.last_step = 0

    def _log(self, values: dict, step: int) -> None:
        # W&B keeps one monotonic step: anything for an earlier step goes to the run's summary instead.
        if step >= self.last_step:
            self.run.log(values, step=step)
            self.last_step = step
        else:
            self.run.summary.update(values)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._log(dict(metrics), step)

    def log_config(self, config: Mapping) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        self._log({name: self.wandb.Html(f"<pre>{text}</pre>")}, step)

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        self._log({name: self.wandb.Histogram(np.asarray(values, dtype=np.float64))}, step)

    def close(self, status: str = "finished") -> None:
        self.run.summary["state"] = status
        self.run.finish(exit_code=0 if status == "finished" else 1)
