"""Weights & Biases backend (logger=wandb, `pip install currytrain[wandb]`). mode=offline (the default)
needs no account and writes <run>/wandb/offline-run-*/ (upload later with `wandb sync`); mode=online
logs to the user's W&B account."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from currytrain.logger.base import journal_tags


class WandbLogger:
    deferred = True
    """MultiLogger calls it from its logging thread, off the training loop (logger.base)."""

    def __init__(self, run_dir: str, project: str = "currytrain", entity: str = "", mode: str = "offline", run_name: str = ""):
        import wandb  # optional extra, imported only when chosen

        self.wandb = wandb
        run_dir_path = Path(run_dir)
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True)
        self.run = wandb.init(
            project=project,
            entity=entity or None,
            mode=mode,
            name=run_name or run_dir_path.name,
            dir=str(run_dir_path),
            tags=[f"{key}={value}"[:64] for key, value in journal_tags(run_dir_path).items() if "version" not in key],
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
        self.run.finish(exit_code=0 if status == "finished" else 1)
