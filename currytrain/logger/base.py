"""The logger protocol the trainer talks to, and a fan-out over several backends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable


@runtime_checkable
class Logger(Protocol):
    """What every tracking backend implements. Backends are built with run_dir as a runtime argument."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_config(self, config: Mapping) -> None: ...

    def close(self) -> None: ...


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

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
