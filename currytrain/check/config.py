"""Typed configs of the check group (conf/check/)."""

from dataclasses import dataclass


@dataclass
class NoCheckConfig:
    """check=none: train directly, no validation-ladder stage."""

    _target_: str | None = None
