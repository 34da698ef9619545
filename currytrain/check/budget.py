"""The ladder's cost, planned before it climbs: one training step of the configured model is timed here, every stage
says what it will cost in such steps (its sub-runs' sizes, batches and sequence lengths relative to the run's), and
when the total exceeds check.budget_seconds the training stages' steps are cut by one common factor (never raised,
never below each stage's floor) so that it fits. The console and the journal say what it will cost before it starts.

Everything here is a ratio to the measured step: on a busy machine the step is slower, the plan cuts more steps, and
the ladder still ends in about its budget; pass check.step_seconds to plan with a fixed step time instead (the same
plan on every machine)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from currytrain.check.probes import get_batch, scratch, seeded, train_step

MIN_RELATIVE = 0.25
"""The smallest cost of a step relative to the configured model's: below it, a step's fixed overhead (Python, the
optimizer's loop over parameters, the kernels' launch) outweighs its arithmetic, so a 16x smaller model is not 16x cheaper."""
FORWARD_SHARE = 1 / 3
"""A forward pass's share of a training step (the backward costs about twice the forward)."""
TIMED_STEPS = 5
"""Steps timed to measure the step time (after two unmeasured ones); the median is kept."""


@dataclass(frozen=True)
class Costs:
    """What one training step of the configured model costs here, and the sizes that scale it."""

    step: float
    """Seconds of one optimizer step of the configured model at trainer.batch_size (grad_accum microbatches)."""
    build: float
    """Seconds to build a run's components (model, optimizer; the data is shared)."""
    sequences: int
    """Sequences per step of the configured run (trainer.batch_size x grad_accum)."""
    seq_len: int
    """Tokens per sequence of the configured run's data."""
    params: int
    """Parameters of the configured model."""
    eval_batches: int = 10
    """Val batches of trainer.batch_size each sub-run evaluates at its end."""
    fit: float = 0.0
    """Seconds of one least-squares refit of a power law (the scaling stage's bootstrap runs hundreds)."""

    def steps(self, count: float, sequences: int | None = None, seq_len: int | None = None, params: int | None = None) -> float:
        """Seconds of `count` steps of `sequences` sequences of `seq_len` tokens for a model of `params` parameters (each
        defaulting to the configured run's)."""
        relative = (sequences or self.sequences) / self.sequences * (seq_len or self.seq_len) / self.seq_len
        relative *= (params or self.params) / self.params
        return count * self.step * max(MIN_RELATIVE, relative)

    def subrun(self, steps: float, sequences: int | None = None, seq_len: int | None = None, params: int | None = None) -> float:
        """Seconds of a sub-run: building it, its steps, and its final evaluation."""
        evals = self.steps(self.eval_batches * FORWARD_SHARE, sequences, seq_len, params)
        return self.build + self.steps(steps, sequences, seq_len, params) + evals


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""The plan's clocks: the seconds one waits here, or the process's CPU seconds (what a quiet machine's wall time is,
with one thread, whatever else runs here)."""


def measure_costs(ctx: Any, step_seconds: float = 0.0, eval_batches: int = 10, clock: str = "wall") -> Costs:
    """Build the configured run's components and time TIMED_STEPS training steps (two more before, unmeasured), inside
    a scratch copy, on `clock` (CLOCKS). step_seconds > 0 is taken as the step time instead (nothing is timed). Every
    rank plans with the slowest rank's step, so that all plan the same steps."""
    now = CLOCKS[clock]
    started = now()
    parts = ctx.build()
    build = now() - started
    cfg = ctx.cfg.trainer
    sequences = int(cfg.batch_size) * int(cfg.grad_accum)
    seq_len = int(getattr(parts.data, "seq_len", 1) or 1)
    params = sum(p.numel() for p in parts.model.parameters())
    if step_seconds <= 0:
        batch = get_batch(parts, int(cfg.batch_size))
        times = []
        with scratch(parts), seeded(parts):
            for _ in range(2 + TIMED_STEPS):
                started = now()
                train_step(parts, batch)
                times.append(now() - started)
        step_seconds = statistics.median(times[2:]) * int(cfg.grad_accum)
    step_seconds = max(ctx.state.gather(step_seconds))
    return Costs(step_seconds, max(ctx.state.gather(build)), sequences, seq_len, params, eval_batches, refit_seconds(now))


def refit_seconds(now=time.perf_counter, refits: int = 8) -> float:
    """Seconds of one power-law refit here on the clock `now` (a small bootstrap timed; numpy and scipy, not torch)."""
    from currytrain.stats.fits import fit_power_law

    started = now()
    fit_power_law([4e4, 8e4, 1.4e5, 2.9e5], [2.32, 2.16, 2.12, 2.18], bootstrap=refits, seed_std=0.06)
    return (now() - started) / (refits + 1)


@dataclass
class Plan:
    """The ladder's planned cost, stage by stage, after the cut."""

    costs: Costs
    budget: float
    clock: str = ""
    """What the summary says after "s": " of CPU" when the plan timed CPU seconds, nothing for wall seconds."""
    factor: float = 1.0
    """The share of their configured steps the training stages keep (1: none cut)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Stage -> planned seconds at the steps it will run."""
    steps: dict[str, str] = field(default_factory=dict)
    """Stage -> its training budget as planned ("200 -> 90 steps"), for the stages that train."""

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def summary(self) -> str:
        """What the console prints before the ladder starts."""
        stages = ", ".join(f"{name} {seconds:.0f} s" + (f" ({self.steps[name]})" if name in self.steps else "") for name, seconds in self.seconds.items())
        head = f"check: one training step of the configured model takes {self.costs.step:.3g} s{self.clock} here ({self.costs.sequences} x {self.costs.seq_len} tokens)"
        if self.budget > 0:
            head += f"; budget {self.budget:.0f} s"
            if self.total > self.budget:
                shared = "" if self.clock else ", or check.plan_clock=cpu on a shared machine"
                head += f": the training stages at their floors cost {self.total:.0f} s, over it (raise check.budget_seconds{shared})"
            elif self.factor < 1:
                head += f": the training stages keep {self.factor:.0%} of their steps"
        return f"{head}\ncheck: plan: {stages}; about {self.total:.0f} s in all ({self.total / 60:.1f} min)"

    def event(self) -> dict:
        return {
            "step_seconds": round(self.costs.step, 4),
            "clock": "cpu" if self.clock else "wall",
            "budget_seconds": self.budget,
            "factor": round(self.factor, 3),
            "planned_seconds": {name: round(value, 1) for name, value in self.seconds.items()},
            "steps": dict(self.steps),
            "total_seconds": round(self.total, 1),
        }


def plan_ladder(stages: dict[str, Any], ctx: Any, costs: Costs, budget: float, rounds: int = 14, clock: str = "wall") -> Plan:
    """Each stage's cost at its configured steps; over `budget` (> 0), the largest factor of their steps the scalable
    stages can keep with the total inside the budget (found by bisection: a sub-run's build and evaluation do not
    shrink with its steps, and floors stop some), then every stage's cost at its planned steps. Below every floor the
    plan keeps the floors, and says what that costs."""
    plan = Plan(costs, budget, " of CPU" if clock == "cpu" else "")
    scalable = [stage for stage in stages.values() if getattr(stage, "scalable", False)]

    def total(factor: float) -> float:
        for stage in scalable:
            stage.scale(factor)
        return sum(stage.cost(ctx, costs) for stage in stages.values())

    if budget > 0 and scalable and total(1.0) > budget:
        low, high = 0.0, 1.0
        for _ in range(rounds):
            middle = (low + high) / 2
            low, high = (middle, high) if total(middle) <= budget else (low, middle)
        plan.factor = low
    for stage in scalable:
        stage.scale(plan.factor)
    plan.steps = {name: steps for name, stage in stages.items() if stage in scalable and (steps := stage.planned_steps()) is not None}
    plan.seconds = {name: stage.cost(ctx, costs) for name, stage in stages.items()}
    return plan


def scaled(configured: int, factor: float, floor: int) -> int:
    """`configured` steps cut to `factor`, never below `floor` (nor above `configured`)."""
    return min(configured, max(floor, round(configured * factor)))


def steps_text(configured: int | None, now: int | None, unit: str = "steps") -> str | None:
    """ "200 steps", or "200 -> 90 steps" when the plan cut them."""
    if configured is None or now is None:
        return None
    return f"{now} {unit}" if now == configured else f"{configured} -> {now} {unit}"
