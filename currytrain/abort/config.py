"""Typed configs of the abort group (conf/abort/)."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class NoAbortConfig:
    """abort=none: no kill criterion; the run goes to trainer.max_steps."""

    _target_: Optional[str] = None
