"""Benchmarking entry points: one optimizer step (forward + backward + step over N microbatches), and
the pieces the scripts in bench/ share to build what they time and to time two setups side by side."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from currytrain.components import Components, build_components
from currytrain.parallel.state import ParallelState, resolve_device
from currytrain.trainer.step import StepResult, causal_lm_loss, run_accumulated_step

__all__ = [
    "run_accumulated_step",
    "StepResult",
    "causal_lm_loss",
    "compose_config",
    "build_step_setup",
    "Components",
    "alternating_step_times",
]

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"  # the checkout's conf/, as launch.py uses it


def compose_config(overrides: list[str]) -> DictConfig:
    """The root config with launch.py's overrides, composed outside a running Hydra app."""
    from hydra import compose, initialize_config_dir

    from currytrain.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def build_step_setup(cfg: DictConfig, state: ParallelState | None = None) -> Components:
    """What one optimizer step needs, built exactly as a run builds it (build_components), by default for
    one process on trainer.device."""
    return build_components(cfg, state or ParallelState(device=resolve_device(cfg.trainer.device)))


def alternating_step_times(steps: dict[str, Callable[[int], Any]], *, rounds: int, per_round: int = 1, warmup: int = 0) -> dict[str, list[float]]:
    """Seconds of each call of each named step function (called with a step index), taking turns:
    `per_round` calls of each per round, so load from other processes hits all of them alike.
    `warmup` untimed rounds come first."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for index in range(warmup + rounds):
        for name, step in steps.items():
            for call in range(per_round):
                tic = time.perf_counter()
                step(index * per_round + call)
                if index >= warmup:
                    times[name].append(time.perf_counter() - tic)
    return times
