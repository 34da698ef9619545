"""The trial inside its job: a StepHook that reports the objective at each eval to the study and prunes.

The sweeper hands the trial to the job through the environment (currytrain.sweep.study.job_env); the job
opens the same storage and rebuilds the same pruner (Optuna keeps pruners out of the storage). Only rank 0
talks to the study; the other ranks receive its decision.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from currytrain.trainer.hooks import CONTINUE, Action, Decision

log = logging.getLogger(__name__)


def intermediate(objective: str, metrics: Mapping[str, float]) -> float | None:
    """The objective's value at this step, on steps that evaluated (None otherwise)."""
    if "val/loss" not in metrics:
        return None
    if objective == "val/bits_per_token":
        return metrics["val/loss"] / math.log(2)
    return metrics.get(objective)


class PruningHook:
    """Reports the objective at every eval; returns PRUNE when the study's pruner says so.

    In a trial with several workers every rank has the hook, only rank 0 holds the trial (trial=None
    elsewhere), and rank 0's decision is broadcast at each eval so that all ranks stop together."""

    def __init__(self, trial: Any | None, objective: str, prunes: bool):
        self.trial = trial
        self.objective = objective
        self.prunes = prunes

    def after_step(self, step: int, metrics: Mapping[str, float]) -> Decision:
        if "val/loss" not in metrics:  # every rank evaluates on the same steps
            return CONTINUE
        decision = self._decide(step, metrics) if self.trial is not None else CONTINUE
        return _agree(decision)

    def _decide(self, step: int, metrics: Mapping[str, float]) -> Decision:
        value = intermediate(self.objective, metrics)
        if value is None or not math.isfinite(value):  # a diverged trial fails at its end, it is not pruned
            return CONTINUE
        self.trial.report(value, step)
        if self.prunes and self.trial.should_prune():
            return Decision(Action.PRUNE, f"trial {self.trial.number} pruned by the study's pruner: {self.objective}={value:.4f} at step {step}")
        return CONTINUE


def _agree(decision: Decision) -> Decision:
    """Rank 0's decision on every rank (a no-op in a single process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return decision
    box = [decision]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def build_pruning_hook() -> PruningHook | None:
    """The hook of the trial this job runs (from the environment), or None outside a sweep and off rank 0."""
    from currytrain.sweep.study import trial_from_env

    found = trial_from_env()
    if found is None:
        return None
    spec, number = found
    if len(spec.directions) > 1:  # Optuna reports and prunes single-objective trials only
        return None
    if int(os.environ.get("RANK", "0")) != 0:  # only rank 0 talks to the study
        return PruningHook(None, spec.objectives[0], prunes=spec.pruner is not None)
    import optuna
    from omegaconf import OmegaConf

    from currytrain.build import build
    from currytrain.sweep.study import open_storage

    pruner = build(OmegaConf.create(spec.pruner)) if spec.pruner else None
    study = optuna.load_study(study_name=spec.study_name, storage=open_storage(spec.storage), pruner=pruner)
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    log.info("sweep trial %d of study %s (pruner: %s)", number, spec.study_name, type(pruner).__name__ if pruner else "none")
    return PruningHook(optuna.trial.Trial(study, trial_id), spec.objectives[0], prunes=pruner is not None)
