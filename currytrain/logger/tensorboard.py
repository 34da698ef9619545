"""TensorBoard backend: scalars, histograms and text per step, the resolved config as text.

A run that belongs to a group (a sweep's trial, a multirun's job, a ladder's sub-run) also writes an HParams
session: its group params (the sampled values) when it starts and its status when it ends, so
`tensorboard --logdir <sweep folder>` shows the sweep in the HParams dashboard, each trial with its final
metrics (the last value of each scalar)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from currytrain.logger.base import hparam_value, read_group

SESSION_STATUS = {"finished": "STATUS_SUCCESS", "failed": "STATUS_FAILURE"}
"""HParams session status per close() status; the others (pruned, aborted, interrupted) are STATUS_UNKNOWN,
as the plugin has no word for a run stopped on purpose: the text `state` says which."""


class TensorBoardLogger:
    deferred = True
    """MultiLogger calls it from its logging thread, off the training loop (logger.base)."""

    def __init__(self, run_dir: str, subdir: str = "tb", flush_secs: int = 30):
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: keep it off the config path

        self.log_dir, self.flush_secs = Path(run_dir) / subdir, flush_secs
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)
        self.group = read_group(run_dir)
        self.session = self.group is not None and not self.group.is_parent
        if self.session:
            self._start_session()

    def _start_session(self) -> None:
        """The HParams plugin's session start: this member's params (at least its place in the group)."""
        from tensorboard.plugins.hparams import summary_v2

        params = {key: hparam_value(value) for key, value in self.group.params.items()} or {self.group.job_type or "member": self.group.member}
        self.writer.file_writer.add_summary(summary_v2.hparams_pb(params, start_time_secs=time.time()))

    def _end_session(self, status: str) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

        code = getattr(api_pb2, SESSION_STATUS.get(status, "STATUS_UNKNOWN"))
        data = plugin_data_pb2.HParamsPluginData(session_end_info=plugin_data_pb2.SessionEndInfo(status=code, end_time_secs=time.time()))
        summary = Summary()
        summary.value.add(tag=metadata.SESSION_END_INFO_TAG, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR)
        self.writer.file_writer.add_summary(summary)

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
        if self.session:
            self.writer.add_text("state", status)
            self._end_session(status)
        self.writer.close()
