"""Typed configs of the logger group (conf/logger/). Several can be active at once: logger=[tensorboard,jsonl]."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from currytrain.rules import bounded, inside_run_folder


@dataclass
class TensorBoardConfig:
    """TensorBoard event files under <run>/<subdir>."""

    _target_: str = "currytrain.logger.tensorboard.TensorBoardLogger"
    subdir: str = "tb"
    """Folder inside the run folder for event files."""
    flush_secs: int = bounded(30, ge=1)
    """How often the writer flushes to disk (seconds)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        return inside_run_folder(node, path, "subdir", "tb")


@dataclass
class JsonlConfig:
    """One JSON object per logged step in <run>/<filename>."""

    _target_: str = "currytrain.logger.jsonl.JsonlLogger"
    filename: str = "metrics.jsonl"
    """File inside the run folder."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        return inside_run_folder(node, path, "filename", "metrics.jsonl")


def _extra_problems(module: str, extra: str, path: str) -> list[str]:
    if importlib.util.find_spec(module) is None:
        return [f"{path} needs the {module} package, which is not installed: pip install 'currytrain[{extra}]' (or choose another logger)"]
    return []


@dataclass
class MLflowConfig:
    """An MLflow run: metrics, the config as params, the journal header as tags (pip install currytrain[mlflow])."""

    _target_: str = "currytrain.logger.mlflow.MLflowLogger"
    tracking_uri: str = ""
    """Where the store is; empty: sqlite:///<run folder's parent>/mlflow.db. Any MLflow URI works
    (http://host:5000, postgresql://...). View with: mlflow ui --backend-store-uri <uri>."""
    experiment: str = "currytrain"
    """MLflow experiment the run is filed under (created when missing)."""
    run_name: str = ""
    """Name of the MLflow run; empty: the run folder's name."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        return _extra_problems("mlflow", "mlflow", path)


WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class WandbConfig:
    """A Weights & Biases run (pip install currytrain[wandb]); offline needs no account."""

    _target_: str = "currytrain.logger.wandb.WandbLogger"
    project: str = "currytrain"
    """W&B project."""
    entity: str = ""
    """W&B team or user; empty: the account's default (online mode only)."""
    mode: str = "offline"
    """offline (files under <run>/wandb, upload later with `wandb sync`), online (needs `wandb login`), or disabled."""
    run_name: str = ""
    """Name of the W&B run; empty: the run folder's name."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = _extra_problems("wandb", "wandb", path)
        if node.mode not in WANDB_MODES:
            problems.append(f"{path}.mode={node.mode} is not one of {list(WANDB_MODES)}: pass {path}.mode=offline")
        return problems
