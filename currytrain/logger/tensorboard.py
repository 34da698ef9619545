"""TensorBoard backend: scalars, histograms and text per step, the resolved config as text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class TensorBoardLogger:
    deferred = True
    """MultiLogger calls it from its logging thread, off the training loop (logger.base)."""

    def __init__(self, run_dir: str, subdir: str = "tb", flush_secs: int = 30):
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: keep it off the config path

        self.log_dir, self.flush_secs = Path(run_dir) / subdir, flush_secs
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)

    def restarted(self, step: int) -> None:
        """A resume re-runs the steps after `step`: a new event file with purge_step=step+1, so TensorBoard
        discards the earlier values of those steps and shows the re-run's."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer.close()
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=self.flush_secs, purge_step=step + 1)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        # One event holding every scalar of the step (what add_scalar writes one event per value for): the same
        # curves for TensorBoard's readers, at a fraction of the serialization.
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=name, simple_value=float(value)) for name, value in metrics.items()])
        self.writer._get_file_writer().add_summary(summary, step)

    def log_config(self, config: Mapping) -> None:
        self.writer.add_text("config", "```\n" + json.dumps(dict(config), indent=2, default=str) + "\n```")
        journal = self.log_dir.parent / "journal.jsonl"
        if journal.is_file():  # the reproducibility header: git SHA, dirty flag, versions, host
            with journal.open() as file:
                self.writer.add_text("journal_header", "```\n" + json.dumps(json.loads(file.readline()), indent=2) + "\n```")

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        self.writer.add_text(name, text, global_step=step)

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        import numpy as np

        self.writer.add_histogram(name, np.asarray(values, dtype=np.float64), global_step=step)

    def close(self, status: str = "finished") -> None:
        self.writer.close()
