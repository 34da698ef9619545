"""The logger protocol the trainer talks to, and a fan-out over several backends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Logger(Protocol):
    """What every tracking backend implements. Backends are built with run_dir as a runtime argument."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_config(self, config: Mapping) -> None: ...

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        """A distribution of values (a tensor or array) at `step`; backends that cannot show one ignore it."""

    def log_text(self, name: str, text: str, step: int) -> None:
        """A block of text (a ladder stage's verdicts) at `step`."""

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

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        for logger in self.loggers:
            if hasattr(logger, "log_histogram"):  # a user backend written before the method existed
                logger.log_histogram(name, values, step)

    def log_text(self, name: str, text: str, step: int) -> None:
        for logger in self.loggers:
            if hasattr(logger, "log_text"):
                logger.log_text(name, text, step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
