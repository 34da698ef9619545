"""The logger protocol the trainer talks to, and a fan-out over several backends.

Every backend takes scalars, the resolved config and text; histograms go to the backends that can show
them (TensorBoard, W&B) and the others ignore them. Only rank 0 builds loggers.
"""

from __future__ import annotations

import json
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


class MultiLogger:
    """Forwards every call to each backend, in the order they were configured."""

    def __init__(self, loggers: list[Logger]):
        self.loggers = loggers

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step)

    def log_config(self, config: Mapping) -> None:
        for logger in self.loggers:
            logger.log_config(config)

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        for logger in self.loggers:
            logger.log_text(name, text, step)

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        for logger in self.loggers:
            logger.log_histogram(name, values, step)

    def restarted(self, step: int) -> None:
        """The run continues from a checkpoint of `step`: the backends that can drop what they logged after it."""
        for logger in self.loggers:
            if isinstance(logger, Restartable):
                logger.restarted(step)

    def close(self, status: str = "finished") -> None:
        for logger in self.loggers:
            logger.close(status)


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
