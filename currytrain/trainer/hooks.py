"""The one extension point inside the training loop: after each optimizer step, every hook sees the step's
metrics (with `val/loss` on steps that evaluated) and decides whether the run goes on.

Abort conditions, sweep pruning and ladder probes are hooks; the loop itself never changes for them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class Action(enum.Enum):
    CONTINUE = "continue"
    STOP = "stop"
    """End the run now: the trainer raises Aborted (exit code 4) with the reason."""
    ROLLBACK = "rollback"
    """Restore the newest complete checkpoint and go on from there with fresh data (the batches the failed
    steps saw are skipped)."""
    PRUNE = "prune"
    """The sweep's pruner ends this trial: the trainer raises Pruned."""


@dataclass(frozen=True)
class Decision:
    action: Action = Action.CONTINUE
    reason: str = ""
    lr_scale: float = 1.0
    """ROLLBACK only: multiply every learning rate by this once restored."""


CONTINUE = Decision()


@runtime_checkable
class StepHook(Protocol):
    def after_step(self, step: int, metrics: Mapping[str, float]) -> Decision:
        """Called once per optimizer step, after logging and checkpointing."""
        ...


def decide(hooks: Sequence[StepHook], step: int, metrics: Mapping[str, float]) -> Decision:
    """Every hook sees the step; the first one that does not continue decides."""
    decisions = [hook.after_step(step, metrics) for hook in hooks]
    return next((decision for decision in decisions if decision.action is not Action.CONTINUE), CONTINUE)
