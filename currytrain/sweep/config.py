"""Typed configs of the sweep group (conf/sweep/)."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class NoSweepConfig:
    """sweep=none: a single run, no Optuna study."""

    _target_: Optional[str] = None
