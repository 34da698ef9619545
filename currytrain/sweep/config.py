"""Typed configs of the sweep group (conf/sweep/)."""

from dataclasses import dataclass


@dataclass
class NoSweepConfig:
    """sweep=none: a single run, no Optuna study."""

    _target_: str | None = None
