"""Stage lr_range: the learning-rate range test (Leslie Smith, "Cyclical Learning Rates", 2017).

The model trains on fresh batches while the lr grows exponentially from min_lr to max_lr; the loss is
smoothed with a bias-corrected exponential moving average and the sweep stops once the smoothed loss
exceeds `diverge_factor` times its minimum. Suggested lr (rule `steepest`, the default): the lr where the
smoothed loss falls fastest per decade of lr, before its minimum. Rule `min_loss`: the lr at the smoothed
minimum divided by `min_loss_divisor`. On the debug model a grid of full runs put the best lr within 2.3x
of the steepest-descent lr and 15x below the min_loss one (docs/ladder.md), hence the default. The weights and optimizer
state are restored afterwards; every parameter group keeps its ratio to the peak lr (muP's per-layer lrs).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch

from currytrain.check import figures
from currytrain.check.budget import scaled, steps_text
from currytrain.check.probes import StepFn, at_chance, data_chance, get_batch, peak_lr, scratch, train_step
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status, fmt, probe
from currytrain.components import Components


@dataclass
class Sweep:
    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    diverged_at: float | None = None
    """The lr at which the smoothed loss passed diverge_factor x its minimum (None: it never did)."""

    burn: int = 1
    """Steps at the start whose smoothed loss still carries the moving average's warm-up (about 1 / (1 - smoothing)):
    a steep slope there is the noise of the first batches, not the lr."""

    def best(self) -> int:
        """Index of the smoothed minimum (the first, if several; 0 for an empty sweep)."""
        finite = [i for i, value in enumerate(self.smoothed) if math.isfinite(value)]
        return min(finite, key=self.smoothed.__getitem__) if finite else 0

    def steepest(self) -> int:
        """Index, before the minimum and after the warm-up, where the smoothed loss falls fastest per unit of log(lr)."""
        end = self.best()
        start = max(1, min(self.burn, end - 1))
        if end - start < 1:
            return end
        slopes = {i: (self.smoothed[i + 1] - self.smoothed[i - 1]) / math.log(self.lrs[i + 1] / self.lrs[i - 1]) for i in range(start, end)}
        slopes = {i: v for i, v in slopes.items() if math.isfinite(v)}
        return min(slopes, key=slopes.get) if slopes else end

    def noise(self) -> float:
        """Std of the raw loss over the warm-up steps, where the lr is too small to move it: batch-to-batch noise."""
        head = [v for v in self.losses[: max(2, self.burn)] if math.isfinite(v)]
        return statistics.stdev(head) if len(head) >= 2 else 0.0


def lr_schedule(min_lr: float, max_lr: float, steps: int) -> list[float]:
    """`steps` lrs from min_lr to max_lr, evenly spaced in log(lr)."""
    ratio = (max_lr / min_lr) ** (1 / max(1, steps - 1))
    return [min_lr * ratio**index for index in range(steps)]


def sweep_lr(parts: Components, step: StepFn, lrs: list[float], batch_size: int, smoothing: float, diverge_factor: float) -> Sweep:
    """Train one step per lr on fresh batches; stop when the smoothed loss diverges."""
    result, average = Sweep(burn=max(1, math.ceil(1 / (1 - smoothing)))), 0.0
    peak = peak_lr(parts)
    ratios = [group.get("initial_lr", group["lr"]) / peak for group in parts.optimizer.param_groups]
    with scratch(parts):
        for index, lr in enumerate(lrs):
            for group, ratio in zip(parts.optimizer.param_groups, ratios):
                group["lr"] = lr * ratio
            torch.manual_seed(index)
            loss = step(parts, get_batch(parts, batch_size, step=index)).loss
            if not math.isfinite(loss):
                result.diverged_at = lr
                break
            average = smoothing * average + (1 - smoothing) * loss
            result.lrs.append(lr)
            result.losses.append(loss)
            result.smoothed.append(average / (1 - smoothing ** (index + 1)))
            if index > 0 and result.smoothed[-1] > diverge_factor * min(result.smoothed):
                result.diverged_at = lr
                break
    return result


def suggest(sweep: Sweep, rule: str, divisor: float) -> float:
    if rule == "steepest":
        return sweep.lrs[sweep.steepest()]
    return sweep.lrs[sweep.best()] / divisor


def range_finding(sweep: Sweep, rule: str, divisor: float, min_drop: float, learns: bool = False, chance: float | None = None) -> Finding:
    """The sweep's verdict. Its expectation (the smoothed loss falls by min_drop, below chance ln C, then diverges
    inside the range) is the only way to a pass. `learns`: an earlier probe showed the model learns (sanity's overfit
    passed), so a flat sweep says the task needs more steps than the sweep has, not that the model cannot learn:
    still a warning (the sweep suggests nothing), with that cause."""
    expected = (
        f"the smoothed loss falls by >= {min_drop:g} nats"
        + (f", below chance ln C = {chance:.3f}," if chance is not None else "")
        + " then diverges inside the range"
    )
    if len(sweep.smoothed) < 3:
        return Finding(
            "lr range",
            Status.FAILED,
            f"diverged after {len(sweep.smoothed)} steps, at lr={fmt(sweep.diverged_at)}",
            expected,
            "the loss blows up at the smallest lr of the sweep",
            "lower check.stages.lr_range.min_lr; if it still diverges, run check=preflight (init scale, gradient flow)",
        )
    best, steep = sweep.best(), sweep.steepest()
    drop = sweep.smoothed[0] - sweep.smoothed[best]
    suggested = suggest(sweep, rule, divisor)
    observed = (
        f"suggested lr {suggested:.3g} ({rule}); smoothed minimum {sweep.smoothed[best]:.3f} at lr {sweep.lrs[best]:.3g}, "
        f"steepest descent at lr {sweep.lrs[steep]:.3g}, drop {drop:.3f} nats, "
        + (f"diverged at lr {sweep.diverged_at:.3g}" if sweep.diverged_at else "no divergence")
    )
    noise = sweep.noise()
    observed += f"; batch-to-batch noise {noise:.3g}"
    if drop < min_drop:
        if learns:
            cause = (
                f"the loss falls {drop:.3g} nats over the sweep, less than {min_drop:g}: this task needs more steps than the sweep has "
                "(sanity's overfit passed, so the model learns); the sweep suggests no lr"
            )
        else:
            cause = (
                "the loss does not fall at any lr of the range: a task that needs more steps than the sweep, or a model that does "
                "not learn; check=sanity's overfit one batch tells them apart"
            )
        return Finding(
            "lr range", Status.WARNING, observed, expected, cause, "run check=sanity (overfit one batch); raise check.stages.lr_range.steps or batch_size"
        )
    if at_chance(sweep.smoothed[best], chance):
        return Finding(
            "lr range",
            Status.WARNING,
            observed,
            expected,
            f"the sweep never takes the loss below chance ln C = {chance:.3f} (its minimum {sweep.smoothed[best]:.3f}): it falls from above "
            "chance (an init whose logits are too large) to chance, so it measures the model unlearning its init, not learning the data",
            "check sanity's init loss; lower the init scale; then rerun the sweep",
        )
    if not reliable(sweep):
        return Finding("lr range", Status.PASSED, observed + "; too flat a sweep to suggest an lr (longer sweeps, larger batches)", expected)
    if sweep.diverged_at is None:
        return Finding(
            "lr range",
            Status.WARNING,
            observed,
            expected,
            "the loss never diverged, so the minimum may sit at the end of the range and the suggestion is a lower bound",
            "raise check.stages.lr_range.max_lr",
        )
    return Finding("lr range", Status.PASSED, observed, expected)


RELIABLE_DROP = 4.0
"""A suggestion is read off the sweep only when its smoothed loss falls by this many times the batch-to-batch noise..."""
RELIABLE_SHARE = 0.1
"""...and by this share of where it started: a sweep that moves the loss by 2% of it says little about the best lr."""


def reliable(sweep: Sweep) -> bool:
    """Whether the sweep falls clearly enough (beyond its noise, by a tenth of its start) to suggest an lr."""
    if not sweep.smoothed:
        return False
    drop = sweep.smoothed[0] - sweep.smoothed[sweep.best()]
    return drop >= RELIABLE_DROP * sweep.noise() and drop >= RELIABLE_SHARE * abs(sweep.smoothed[0])


def configured_finding(configured: float, suggested: float, tolerance: float, sweep: Sweep | None = None) -> Finding:
    ratio = configured / suggested if suggested > 0 else math.inf
    observed = f"optimizer.lr={configured:g} is {ratio:.2g}x the suggested {suggested:.3g}"
    expected = f"within a factor {tolerance:g} of the suggestion"
    if sweep is not None and sweep.smoothed and not reliable(sweep):
        drop, noise = sweep.smoothed[0] - sweep.smoothed[sweep.best()], sweep.noise()
        note = f"the sweep's loss falls {drop:.3g} nats (noise {noise:.3g}, from {sweep.smoothed[0]:.3g}): too flat to suggest an lr"
        return Finding("configured lr", Status.SKIPPED, note, expected, "", "a longer sweep (check.stages.lr_range.steps) or larger batches")
    if 1 / tolerance <= ratio <= tolerance:
        return Finding("configured lr", Status.PASSED, observed, expected)
    word = "above" if ratio > 1 else "below"
    return Finding(
        "configured lr",
        Status.WARNING,
        observed,
        expected,
        f"the configured lr is far {word} what the range test suggests",
        f"try optimizer.lr={suggested:.3g} (or confirm with a small grid: python launch.py -m optimizer.lr=...)",
    )


class LRRange(Stage):
    """Exponential lr sweep with divergence detection and a suggested lr. Thresholds: LRRangeConfig's fields."""

    name = "lr_range"

    def __init__(
        self,
        min_lr: float = 1e-5,
        max_lr: float = 10.0,
        steps: int = 100,
        batch_size: int = 16,
        smoothing: float = 0.9,
        diverge_factor: float = 4.0,
        rule: str = "steepest",
        min_loss_divisor: float = 10.0,
        min_drop: float = 0.1,
        lr_tolerance: float = 3.0,
    ):
        self.min_lr, self.max_lr, self.steps, self.batch_size = min_lr, max_lr, steps, batch_size
        self.smoothing, self.diverge_factor, self.rule, self.min_loss_divisor = smoothing, diverge_factor, rule, min_loss_divisor
        self.min_drop, self.lr_tolerance = min_drop, lr_tolerance
        self.configured_steps = steps
        self.step_fn: StepFn = train_step
        self.sweep: Sweep | None = None
        """The last sweep (tests and bench/ read it)."""

    scalable = True
    FLOOR = 50
    """Fewest sweep steps a budget leaves: 30 steps over the six decades of the default range put the suggestion a
    factor of 3-4 from the full sweep's and warned on a healthy model's configured lr; 50 keep 8 steps a decade."""

    def cost(self, ctx: StageContext, costs) -> float:
        return costs.build + costs.steps(self.steps, sequences=self.batch_size)

    def scale(self, factor: float) -> None:
        self.steps = scaled(self.configured_steps, factor, self.FLOOR)

    def planned_steps(self) -> str | None:
        return steps_text(self.configured_steps, self.steps)

    def assess(self, parts: Components, ctx: StageContext) -> StageResult:
        result = StageResult(self.name)
        lrs = lr_schedule(self.min_lr, self.max_lr, self.steps)
        sweep = Sweep()
        chance = data_chance(parts.data)

        def run() -> Finding:
            nonlocal sweep
            sweep = sweep_lr(parts, self.step_fn, lrs, self.batch_size, self.smoothing, self.diverge_factor)
            learns = "overfit one batch" in ctx.measured.get("passed", ())
            return range_finding(sweep, self.rule, self.min_loss_divisor, self.min_drop, learns, chance)

        result.findings.append(probe("lr range", run))
        self.sweep = sweep
        if len(sweep.smoothed) < 3:
            return result
        suggested = suggest(sweep, self.rule, self.min_loss_divisor)
        result.findings.append(configured_finding(peak_lr(parts), suggested, self.lr_tolerance, sweep))
        if ctx.state.is_main:
            result.figures.append(figures.lr_range(Path(ctx.run_dir) / "lr_range.png", sweep, suggested, peak_lr(parts), chance))
        result.details = f"Suggested: `optimizer.lr={suggested:.3g}` (rule `{self.rule}`; {len(sweep.lrs)} steps of batch {self.batch_size})."
        return result
