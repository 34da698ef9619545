"""The logger protocol the trainer talks to, and a fan-out over several backends.

Every backend takes scalars, the resolved config and text; histograms go to the backends that can show
them (TensorBoard, W&B) and the others ignore them. Only rank 0 builds loggers.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Logger(Protocol):
    """What every tracking backend implements. Backends are built with run_dir as a runtime argument."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_config(self, config: Mapping) -> None: ...

    def log_text(self, name: str, text: str, step: int = 0) -> None: ...

    def log_histogram(self, name: str, values: Any, step: int) -> None: ...

    def close(self, status: str = "finished") -> None:
        """status: finished, or failed when the run ended any other way."""
        ...


@runtime_checkable
class Restartable(Protocol):
    """A backend that can forget what it logged after a step: a resumed (or rolled-back) run re-runs the
    steps past its checkpoint, and the re-run's values must replace the earlier ones, not join them."""

    def restarted(self, step: int) -> None: ...


QUEUE_CALLS = 4096
"""Calls waiting for the deferred backends at most: a backend slower than training slows it down rather than
filling memory."""


class MultiLogger:
    """Forwards every call to each backend. Backends marked `deferred = True` (TensorBoard, MLflow, W&B) are
    called from one logging thread, in order, so that a run logging every step does not wait for their
    serialization and stores; the others (jsonl, and every logger of a project or a test) are called at once,
    in the training loop. close() drains the thread; an error a deferred backend raised is raised at the next
    call or at close. What a killed run had queued for the deferred backends is lost; the journal and jsonl keep it."""

    def __init__(self, loggers: list[Logger]):
        self.loggers = loggers
        self.now = [logger for logger in loggers if not getattr(logger, "deferred", False)]
        self.later = [logger for logger in loggers if getattr(logger, "deferred", False)]
        self.error: BaseException | None = None
        self.queue: queue.Queue | None = None
        if self.later:
            self.queue = queue.Queue(maxsize=QUEUE_CALLS)
            self.thread = threading.Thread(target=self._work, name="currytrain-loggers", daemon=True)
            self.thread.start()

    def _work(self) -> None:
        assert self.queue is not None
        while (call := self.queue.get()) is not None:
            method, args = call
            for logger in self.later:
                try:
                    if method == "restarted":
                        if isinstance(logger, Restartable):
                            logger.restarted(*args)
                    else:
                        getattr(logger, method)(*args)
                except Exception as error:  # the training thread raises it at its next call
                    self.error = self.error or error

    def _call(self, method: str, *args: Any) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        for logger in self.now:
            getattr(logger, method)(*args)
        if self.queue is not None:
            self.queue.put((method, args))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._call("log_metrics", dict(metrics), step)  # a copy: the trainer adds to its dict after logging it

    def log_config(self, config: Mapping) -> None:
        self._call("log_config", config)

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        self._call("log_text", name, text, step)

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        self._call("log_histogram", name, values.clone() if hasattr(values, "clone") else values, step)

    def restarted(self, step: int) -> None:
        """The run continues from a checkpoint of `step`: the backends that can drop what they logged after it."""
        for logger in self.now:
            if isinstance(logger, Restartable):
                logger.restarted(step)
        if self.queue is not None:
            self.queue.put(("restarted", (step,)))

    def close(self, status: str = "finished") -> None:
        try:
            for logger in self.now:
                logger.close(status)
        finally:
            if self.queue is not None:
                self.queue.put(("close", (status,)))
                self.queue.put(None)
                self.thread.join()
                self.queue = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def journal_tags(run_dir: Path) -> dict[str, str]:
    """The journal header's reproducibility facts (git SHA, dirty flag, seed, host, versions) as tags."""
    journal = run_dir / "journal.jsonl"
    if not journal.is_file():
        return {}
    with journal.open() as file:
        header = json.loads(file.readline() or "{}")
    keys = ("seed", "git_sha", "git_dirty", "host", "world_size")
    tags = {f"currytrain.{key}": str(header.get(key)) for key in keys if key in header}
    tags.update({f"currytrain.version.{name}": str(version) for name, version in header.get("versions", {}).items()})
    return tags
