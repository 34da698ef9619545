"""The rich progress bar: step, loss, tokens/s and ETA. Off when progress is disabled."""

from __future__ import annotations

import logging
import sys

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress


class Progress:
    def __init__(self, total: int, completed: int, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        self.bar = RichProgress(
            TextColumn("step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TextColumn("{task.fields[tokens_per_s]:,.0f} tok/s"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        self.task = self.bar.add_task("train", total=total, completed=completed, loss=float("nan"), tokens_per_s=0.0)

    def __enter__(self) -> Progress:
        if self.enabled:
            self.bar.start()
            self._route_logging_through_bar()
        return self

    def _route_logging_through_bar(self) -> None:
        """On a terminal rich swaps sys.stdout/err for proxies that print above the bar; log handlers
        still hold the real streams, so their lines would be glued to the bar. Point them at the proxies."""
        self.rerouted = []
        originals = {id(sys.__stdout__): sys.stdout, id(sys.__stderr__): sys.stderr}
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler and id(handler.stream) in originals:
                proxy = originals[id(handler.stream)]
                if proxy is not handler.stream:
                    self.rerouted.append((handler, handler.setStream(proxy)))

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if self.enabled:
            self.bar.update(self.task, completed=step, loss=loss, tokens_per_s=tokens_per_s)

    def __exit__(self, *exc) -> None:
        if self.enabled:
            for handler, stream in self.rerouted:
                handler.setStream(stream)
            self.bar.stop()
