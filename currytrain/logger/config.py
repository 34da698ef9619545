"""Typed configs of the logger group (conf/logger/). Several can be active at once: logger=[tensorboard,jsonl]."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TensorBoardConfig:
    """TensorBoard event files under <run>/<subdir>."""

    _target_: str = "currytrain.logger.tensorboard.TensorBoardLogger"
    subdir: str = "tb"
    """Folder inside the run folder for event files."""
    flush_secs: int = 30
    """How often the writer flushes to disk (seconds)."""


@dataclass
class JsonlConfig:
    """One JSON object per logged step in <run>/<filename>."""

    _target_: str = "currytrain.logger.jsonl.JsonlLogger"
    filename: str = "metrics.jsonl"
    """File inside the run folder."""
