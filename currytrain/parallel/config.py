"""Typed configs of the parallel group (conf/parallel/)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SingleConfig:
    """One process on one device: no process group, no mesh."""

    _target_: str = "currytrain.parallel.single.SingleDevice"
    nproc: int = 1
    """Worker processes launch.py starts; single runs exactly one."""
