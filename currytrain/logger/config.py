"""Typed configs of the logger group (conf/logger/). Several can be active at once: logger=[tensorboard,jsonl]."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from currytrain.rules import bounded, inside_run_folder


@dataclass
class TensorBoardConfig:
    """TensorBoard event files under <run>/<subdir>."""

    _target_: str = "currytrain.logger.tensorboard.TensorBoardLogger"
    subdir: str = "tb"
    """Folder inside the run folder for event files."""
    flush_secs: int = bounded(30, ge=1, le=86400)
    """How often the writer flushes to disk (seconds, at most a day)."""

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
    log_model: bool = False
    """When the run finishes, log its final checkpoint (torch.distributed.checkpoint shards) and resolved.yaml as
    an MLflow 3 LoggedModel of the run, with the model config as its params."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = _extra_problems("mlflow", "mlflow", path)
        if not problems and node.log_model and int(metadata.version("mlflow").split(".")[0]) < 3:
            problems.append(
                f"{path}.log_model=true needs MLflow 3 (LoggedModel), but mlflow {metadata.version('mlflow')} is installed: pip install 'mlflow>=3'"
            )
        return problems


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


AIM_PYTHONS = ((3, 10), (3, 12))
"""The Pythons aim 3.29 (its last release) has wheels for: the [aim] extra installs nothing on others."""


@dataclass
class AimConfig:
    """An Aim run: metrics with their context (train, val), the config as hparams, texts, histograms
    (pip install 'currytrain[aim]'; Python 3.10 to 3.12)."""

    _target_: str = "currytrain.logger.aim.AimLogger"
    repo: str = ""
    """Folder holding the Aim repo (.aim/); empty: the run folder's parent (the sweep's or ladder's store for
    their runs). View with: aim up --repo <folder>."""
    experiment: str = "currytrain"
    """Aim experiment of a run on its own; a sweep's trials and a ladder's sub-runs go to their group's."""
    run_name: str = ""
    """Name of the Aim run; empty: the run folder's name (<stage>/<name> for a ladder's sub-run)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        low, high = AIM_PYTHONS
        if not low <= sys.version_info[:2] <= high:
            here = ".".join(map(str, sys.version_info[:2]))
            return [
                f"{path} needs the aim package, which has no release for Python {here} (pip install 'currytrain[aim]' installs it on "
                f"Python {low[0]}.{low[1]} to {high[0]}.{high[1]}): choose another logger, or run from a Python {high[0]}.{high[1]} environment"
            ]
        return _extra_problems("aim", "aim", path)
