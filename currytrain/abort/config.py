"""Typed configs of the abort group (conf/abort/): conditions that end or roll back a run while it trains.

Every condition is a field that is off at 0; several are on at once. `abort=default` (the default)
stops a run whose loss is not finite or whose steps keep being skipped for non-finite gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from currytrain.rules import at_least, one_of

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
    max_rollbacks: int = 2
    """Rollbacks allowed in one run; the next tripped condition stops it."""
    rollback_lr_scale: float = 1.0
    """Multiply every learning rate by this after each rollback (0.5 halves it)."""
    non_finite_loss: bool = True
    """Trip when the train loss is NaN or infinite."""
    max_skipped_steps: int = 0
    """Trip after this many consecutive steps skipped for non-finite gradients; 0 is off."""
    loss_above: float = 0.0
    """Trip when the train loss exceeds this value at or after step loss_above_after (nats); 0 is off."""
    loss_above_after: int = 0
    """First step at which loss_above applies."""
    patience: int = 0
    """Trip when `metric` has not improved by min_delta for this many consecutive observations (evals for
    val/loss, steps for train/loss); 0 is off."""
    metric: str = "val/loss"
    """What patience watches: val/loss or train/loss."""
    min_delta: float = 0.0
    """Improvement (nats) that resets patience."""
    grad_spike_z: float = 0.0
    """Trip when the gradient norm is this many standard deviations above its trailing window; 0 is off."""
    window: int = 50
    """Trailing steps for grad_spike_z and min_throughput_ratio."""
    min_throughput_ratio: float = 0.0
    """Trip when tokens/s falls below this fraction of the trailing window's median (0.3: a 70% drop); 0 is off."""
    max_seconds: float = 0.0
    """Wall-clock budget of the training loop (seconds); 0 is off. A budget stops, it never rolls back."""
    max_tokens: int = 0
    """Token budget (training tokens of this run); 0 is off."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = one_of(node, path, "action", ABORT_ACTIONS) + one_of(node, path, "metric", WATCHED_METRICS)
        problems += at_least(node, path, ("window",), 2) + at_least(
            node, path, ("max_rollbacks", "max_skipped_steps", "patience", "loss_above_after", "max_tokens"), 0
        )
        for key in ("loss_above", "min_delta", "grad_spike_z", "max_seconds"):
            if not node[key] >= 0:
                problems.append(f"{path}.{key}={node[key]} must be >= 0 (0 is off): pass {path}.{key}=0")
        if not 0 < node.rollback_lr_scale <= 1:
            problems.append(f"{path}.rollback_lr_scale={node.rollback_lr_scale} must be in (0, 1]: pass {path}.rollback_lr_scale=0.5")
        if not 0 <= node.min_throughput_ratio < 1:
            problems.append(f"{path}.min_throughput_ratio={node.min_throughput_ratio} must be in [0, 1): pass {path}.min_throughput_ratio=0.3")
        return problems
