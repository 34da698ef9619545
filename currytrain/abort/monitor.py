"""AbortMonitor: the abort group's StepHook. Each condition is a method returning why it trips, or None."""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Mapping

from currytrain.trainer.hooks import CONTINUE, Action, Decision


class AbortMonitor:
    """Checks the enabled conditions after every step. Faults (a non-finite loss, skipped steps, a loss
    above its bound, a gradient spike) act per `action`; a plateau, a throughput collapse and budgets stop.

    Fields: see AbortConfig (currytrain/abort/config.py); each is off at 0.
    """

    def __init__(
        self,
        action: str = "stop",
        max_rollbacks: int = 2,
        rollback_lr_scale: float = 1.0,
        non_finite_loss: bool = True,
        max_skipped_steps: int = 0,
        loss_above: float = 0.0,
        loss_above_after: int = 0,
        patience: int = 0,
        metric: str = "val/loss",
        min_delta: float = 0.0,
        grad_spike_z: float = 0.0,
        window: int = 50,
        min_throughput_ratio: float = 0.0,
        max_seconds: float = 0.0,
        max_tokens: int = 0,
    ):
        self.action, self.max_rollbacks, self.rollback_lr_scale = action, max_rollbacks, rollback_lr_scale
        self.non_finite_loss, self.max_skipped_steps = non_finite_loss, max_skipped_steps
        self.loss_above, self.loss_above_after = loss_above, loss_above_after
        self.patience, self.metric, self.min_delta = patience, metric, min_delta
        self.grad_spike_z, self.min_throughput_ratio, self.max_seconds, self.max_tokens = grad_spike_z, min_throughput_ratio, max_seconds, max_tokens
        self.grad_norms: deque[float] = deque(maxlen=window)
        self.throughputs: deque[float] = deque(maxlen=window)
        self.skipped_in_a_row = 0
        self.best = math.inf
        self.since_best = 0
        self.tokens = 0
        self.started = time.monotonic()
        self.rollbacks = 0

    def after_step(self, step: int, metrics: Mapping[str, float]) -> Decision:
        # Budgets, a plateau and a throughput collapse stop: going back in time would not change them.
        final = self._budget(metrics) or self._no_improvement(step, metrics) or self._throughput(step, metrics)
        if final:
            return Decision(Action.STOP, final)
        fault = self._fault(step, metrics)
        self._remember(metrics)
        if fault is None:
            return CONTINUE
        if self.action == "rollback" and self.rollbacks < self.max_rollbacks:
            self.rollbacks += 1
            self._forget()
            return Decision(Action.ROLLBACK, f"{fault} (rollback {self.rollbacks} of {self.max_rollbacks})", lr_scale=self.rollback_lr_scale)
        suffix = f" after {self.rollbacks} rollbacks" if self.action == "rollback" else ""
        return Decision(Action.STOP, fault + suffix)

    # ------------------------------------------------------------------------------------ conditions

    def _fault(self, step: int, metrics: Mapping[str, float]) -> str | None:
        checks = (self._non_finite, self._skipped, self._loss_above, self._grad_spike)
        return next((reason for check in checks if (reason := check(step, metrics))), None)

    def _non_finite(self, step: int, metrics: Mapping[str, float]) -> str | None:
        loss = metrics["train/loss"]
        if self.non_finite_loss and not math.isfinite(loss):
            return f"abort.non_finite_loss: the train loss is {loss} at step {step}"
        return None

    def _skipped(self, step: int, metrics: Mapping[str, float]) -> str | None:
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if metrics.get("train/skipped") else 0
        if self.max_skipped_steps and self.skipped_in_a_row >= self.max_skipped_steps:
            return f"abort.max_skipped_steps: {self.skipped_in_a_row} steps in a row skipped for non-finite gradients (last: step {step})"
        return None

    def _loss_above(self, step: int, metrics: Mapping[str, float]) -> str | None:
        loss = metrics["train/loss"]
        if self.loss_above and step >= self.loss_above_after and loss > self.loss_above:
            return f"abort.loss_above: the train loss {loss:.4f} exceeds {self.loss_above} at step {step}"
        return None

    def _no_improvement(self, step: int, metrics: Mapping[str, float]) -> str | None:
        value = metrics.get(self.metric)
        if not self.patience or value is None:
            return None
        if value < self.best - self.min_delta:
            self.best, self.since_best = value, 0
            return None
        self.since_best += 1
        if self.since_best >= self.patience:
            return f"abort.patience: {self.metric} has not improved on {self.best:.4f} for {self.since_best} observations (step {step})"
        return None

    def _grad_spike(self, step: int, metrics: Mapping[str, float]) -> str | None:
        norm = metrics["train/grad_norm"]
        if not self.grad_spike_z or len(self.grad_norms) < self.grad_norms.maxlen or not math.isfinite(norm):
            return None
        mean, spread = statistics.fmean(self.grad_norms), statistics.pstdev(self.grad_norms)
        z = (norm - mean) / spread if spread > 0 else 0.0
        if z > self.grad_spike_z:
            return f"abort.grad_spike_z: the gradient norm {norm:.3g} at step {step} is {z:.1f} standard deviations above its trailing mean {mean:.3g}"
        return None

    def _throughput(self, step: int, metrics: Mapping[str, float]) -> str | None:
        rate = metrics["train/tokens_per_s"]
        if not self.min_throughput_ratio or len(self.throughputs) < self.throughputs.maxlen:
            return None
        median = statistics.median(self.throughputs)
        if rate < self.min_throughput_ratio * median:
            return f"abort.min_throughput_ratio: {rate:,.0f} tokens/s at step {step} is below {self.min_throughput_ratio} x the trailing median {median:,.0f}"
        return None

    def _budget(self, metrics: Mapping[str, float]) -> str | None:
        self.tokens += metrics.get("train/tokens", 0)
        if self.max_tokens and self.tokens >= self.max_tokens:
            return f"abort.max_tokens: {self.tokens:,} training tokens reached the budget of {self.max_tokens:,}"
        seconds = time.monotonic() - self.started
        if self.max_seconds and seconds >= self.max_seconds:
            return f"abort.max_seconds: {seconds:.0f} s of training reached the budget of {self.max_seconds:.0f} s"
        return None

    # -------------------------------------------------------------------------------------- history

    def _remember(self, metrics: Mapping[str, float]) -> None:
        if math.isfinite(metrics["train/grad_norm"]):
            self.grad_norms.append(metrics["train/grad_norm"])
        self.throughputs.append(metrics["train/tokens_per_s"])

    def _forget(self) -> None:
        """After a rollback the failed steps' statistics no longer describe the run."""
        self.skipped_in_a_row = 0
        self.grad_norms.clear()
        self.throughputs.clear()
