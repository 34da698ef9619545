"""TensorBoard backend: scalars per step, histograms, texts, the resolved config as text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class TensorBoardLogger:
    def __init__(self, run_dir: str, subdir: str = "tb", flush_secs: int = 30):
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: keep it off the config path

        self.log_dir = Path(run_dir) / subdir
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        self.writer.add_histogram(name, values, global_step=step)

    def log_text(self, name: str, text: str, step: int) -> None:
        self.writer.add_text(name, "```\n" + text + "\n```", global_step=step)

    def log_config(self, config: Mapping) -> None:
        self.writer.add_text("config", "```\n" + json.dumps(dict(config), indent=2, default=str) + "\n```")

    def close(self) -> None:
        self.writer.close()
