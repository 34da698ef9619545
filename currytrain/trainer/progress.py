"""How a run shows its progress (step, loss, tokens/s, ETA): the rich bar on a terminal, log lines every
trainer.progress_every seconds when the output goes to a file or a pipe (nohup, SLURM, tee), nothing when
trainer.progress=false. Either way it warns when a step takes far longer than the steps before it."""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from collections import deque
from datetime import timedelta

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

log = logging.getLogger(__name__)

SLOW_FACTOR = 4.0
"""A fetch whose seconds per step exceed the running median by this factor is flagged."""
MEDIAN_WINDOW = 50
"""Fetches the running median is taken over."""
MIN_SAMPLES = 5
"""Fetches to see before flagging any (the first ones warm up caches, allocators and compilers)."""
WARN_EVERY_SECONDS = 300.0
"""Flag at most once per this many seconds: a machine that stays slow is said once, not every step."""


class Progress:
    """total: the run's last step; completed: the step it starts from (a resume); enabled: trainer.progress;
    every_seconds: trainer.progress_every, the interval of the lines (no bar on a terminal: 0 there too)."""

    def __init__(self, total: int, completed: int, enabled: bool = True, every_seconds: float = 30.0):
        self.enabled, self.total, self.every_seconds = enabled, total, every_seconds
        self.steps = SlowSteps()
        self.bar = None
        if enabled and Console().is_terminal:
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
        self.start_step, self.started = completed, time.perf_counter()
        self.printed_at = self.started

    def __enter__(self) -> Progress:
        if self.bar is not None:
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

    def update(self, step: int, metrics: dict[str, float], fetched: bool) -> None:
        """After each step, with the latest fetched step's metrics; fetched: this step read them back (the steps
        between fetches share the seconds of their fetch, which the slow-step check sees once)."""
        if fetched:
            self.steps.add(step, metrics["train/step_seconds"])
        if not self.enabled:
            return
        loss, tokens_per_s = metrics["train/loss"], metrics["train/tokens_per_s"]
        if self.bar is not None:
            self.bar.update(self.task, completed=step, loss=loss, tokens_per_s=tokens_per_s)
            return
        now = time.perf_counter()
        if now - self.printed_at >= self.every_seconds or step == self.total or step == self.start_step + 1:
            self.printed_at = now
            log.info("%s", self.line(step, loss, tokens_per_s, now))

    def line(self, step: int, loss: float, tokens_per_s: float, now: float) -> str:
        """`step 120/1200 (10%) | loss 2.3456 | 9,390 tok/s | ETA 0:01:23`, the ETA from the mean step time so far."""
        done = step - self.start_step
        eta = (now - self.started) / done * (self.total - step) if done else 0.0
        percent = f"{100 * step / self.total:.0f}%"
        return f"step {step}/{self.total} ({percent}) | loss {loss:.4f} | {tokens_per_s:,.0f} tok/s | ETA {timedelta(seconds=round(eta))}"

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            for handler, stream in self.rerouted:
                handler.setStream(stream)
            self.bar.stop()


class SlowSteps:
    """Warns when the seconds per step of a fetch exceed the running median of the fetches before it by
    SLOW_FACTOR: on a shared machine, the usual cause is another process (or more threads than free cores)."""

    def __init__(self):
        self.seconds: deque[float] = deque(maxlen=MEDIAN_WINDOW)
        self.warned_at = -float("inf")

    def add(self, step: int, seconds: float) -> bool:
        """Record a fetch's seconds per step; True when it was flagged."""
        slow = len(self.seconds) >= MIN_SAMPLES and seconds > SLOW_FACTOR * (median := statistics.median(self.seconds))
        self.seconds.append(seconds)
        if not slow or time.monotonic() - self.warned_at < WARN_EVERY_SECONDS:
            return slow
        self.warned_at = time.monotonic()
        log.warning(
            "step %d took %.3f s, %.1fx the median %.3f s of the steps before it: something else is likely using this machine's cores "
            "(other processes, or more torch threads than free cores: %d threads on %d cores here; docs/training.md, 'Shared machines')",
            step,
            seconds,
            seconds / median,
            median,
            torch.get_num_threads(),
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        )
        return slow
