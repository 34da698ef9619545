"""Typed configs of the abort group (conf/abort/): conditions that end or roll back a run while it trains.

Every condition is a field that is off at 0; several are on at once. `abort=default` (the default)
stops a run whose loss is not finite or whose steps keep being skipped for non-finite gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from currytrain.rules import bounded, one_of

ABORT_ACTIONS = ("stop", "rollback")
WATCHED_METRICS = ("val/loss", "train/loss")
"""Metrics the no-improvement condition can watch (lower is better)."""


@dataclass
class NoAbortConfig:
    """abort=none: no kill criterion; the run goes to trainer.max_steps."""

    _target_: str | None = None


@dataclass
class AbortConfig:
    """Abort conditions, checked after every optimizer step by a StepHook (currytrain/abort/monitor.py)."""

    _target_: str = "currytrain.abort.monitor.AbortMonitor"
    action: str = "stop"
    """What a tripped fault (non_finite_loss, max_skipped_steps, loss_above, grad_spike_z) does: stop (exit
    code 4, an `abort` event) or rollback (restore the newest complete checkpoint, skip the data the failed
    steps saw, scale the LR; needs trainer.checkpoint_every). patience, min_throughput_ratio and the
    budgets always stop."""
    max_rollbacks: int = bounded(2, ge=0)
    """Rollbacks allowed in one run; the next tripped condition stops it."""
    rollback_lr_scale: float = bounded(1.0, gt=0, le=1, example=0.5)
    """Multiply every learning rate by this after each rollback (0.5 halves it)."""
    non_finite_loss: bool = True
    """Trip when the train loss is NaN or infinite."""
    max_skipped_steps: int = bounded(0, ge=0)
    """Trip after this many consecutive steps skipped for non-finite gradients; 0 is off."""
    loss_above: float = bounded(0.0, ge=0)
    """Trip when the train loss exceeds this value at or after step loss_above_after (nats); 0 is off."""
    loss_above_after: int = bounded(0, ge=0)
    """First step at which loss_above applies."""
    patience: int = bounded(0, ge=0)
    """Trip when `metric` has not improved by min_delta for this many consecutive observations (evals for
    val/loss, steps for train/loss); 0 is off."""
    metric: str = "val/loss"
    """What patience watches: val/loss or train/loss."""
    min_delta: float = bounded(0.0, ge=0)
    """Improvement (nats) that resets patience."""
    grad_spike_z: float = bounded(0.0, ge=0)
    """Trip when the gradient norm is this many standard deviations above its trailing window; 0 is off."""
    window: int = bounded(50, ge=2, le=10**6)
    """Trailing steps for grad_spike_z and min_throughput_ratio (at most a million)."""
    min_throughput_ratio: float = bounded(0.0, ge=0, lt=1, example=0.3)
    """Trip when tokens/s falls below this fraction of the trailing window's median (0.3: a 70% drop); 0 is off."""
    max_seconds: float = bounded(0.0, ge=0)
    """Wall-clock budget of the training loop (seconds); 0 is off. A budget stops, it never rolls back."""
    max_tokens: int = bounded(0, ge=0)
    """Token budget (training tokens of this run); 0 is off."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        return one_of(node, path, "action", ABORT_ACTIONS) + one_of(node, path, "metric", WATCHED_METRICS)
