"""Typed configs of the abort group (conf/abort/)."""

from dataclasses import dataclass


@dataclass
class NoAbortConfig:
    """abort=none: no kill criterion; the run goes to trainer.max_steps."""

    _target_: str | None = None
