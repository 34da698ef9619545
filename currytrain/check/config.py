"""Typed configs of the check group (conf/check/)."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class NoCheckConfig:
    """check=none: train directly, no validation-ladder stage."""

    _target_: Optional[str] = None
