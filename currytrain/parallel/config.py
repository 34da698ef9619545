"""Typed configs of the parallel group (conf/parallel/)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SingleConfig:
    """One process on one device: no process group, no mesh."""

    _target_: str = "currytrain.parallel.single.SingleDevice"
    nproc: int = 1
    """Worker processes launch.py starts; single runs exactly one."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        if node.nproc != 1:
            return [f"{path}.nproc={node.nproc}: parallel=single runs one process: pass {path}.nproc=1, or choose a multi-process strategy"]
        return []
