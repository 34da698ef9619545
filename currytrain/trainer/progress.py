"""The rich progress bar: step, loss, tokens/s and ETA. Off when progress is disabled."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn


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

    def __enter__(self) -> "Progress":
        if self.enabled:
            self.bar.start()
        return self

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if self.enabled:
            self.bar.update(self.task, completed=step, loss=loss, tokens_per_s=tokens_per_s)

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.bar.stop()
