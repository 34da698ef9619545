"""Stage capacity: models of several widths and depths trained at one fixed compute budget.

The budget is the configured model's: C = 6 N D with D the tokens of `budget_steps` steps. Every (width,
depth) pair gets the steps that spend the same C (a smaller model trains longer), at least `min_steps`.
The final train loss against parameters shows where capacity stops paying: the saturation point is the
smallest model that no larger one beats by more than `min_gain` nats, or by more than the seed noise of a
difference of two runs when the seeds stage of the same ladder measured it. A curve still falling at the largest
size is reported (at this budget the model is capacity-bound, and a bigger one would train better): a property of
the budget, not a fault. Gate: every shape trains. A model without a width field (model.dim) skips the stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from currytrain.check import figures
from currytrain.check.budget import scaled, steps_text
from currytrain.check.probes import at_chance, data_chance
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status
from currytrain.check.subruns import SubRun, derive, shared_data, train_subrun, width_overrides, width_skipped
from currytrain.components import Components


@dataclass
class Shape:
    width: int
    depth: int
    num_params: int
    steps: int

    @property
    def name(self) -> str:
        return f"dim_{self.width}_layers_{self.depth}" if self.depth else f"dim_{self.width}"

    def overrides(self, model_cfg) -> list[str]:
        return [*width_overrides(model_cfg, self.width), *depth_overrides(self.depth), f"trainer.max_steps={self.steps}", f"trainer.eval_every={self.steps}"]


def depth_overrides(depth: int) -> list[str]:
    """model.n_layers for a depth; none for depth 0 (a model without that field keeps its own depth)."""
    return [f"model.n_layers={depth}"] if depth else []


def plan(ctx: StageContext, widths: list[int], depths: list[int], budget_steps: int, min_steps: int) -> list[Shape]:
    """Every (width, depth) with the steps that spend the configured model's compute of budget_steps steps."""
    from currytrain.estimate import count_parameters

    budget = count_parameters(ctx.cfg.model) * budget_steps  # 6 * tokens per step cancels out
    shapes = []
    for depth in depths if "n_layers" in ctx.cfg.model else [0]:  # a model without the field: widths alone
        for width in widths:
            model = derive(ctx.cfg, [*width_overrides(ctx.cfg.model, width), *depth_overrides(depth)]).model
            num_params = count_parameters(model)
            shapes.append(Shape(width, depth, num_params, max(min_steps, round(budget / num_params))))
    return sorted(shapes, key=lambda shape: shape.num_params)


def saturation(runs: list[SubRun], min_gain: float) -> int:
    """Index (runs sorted by size) of the smallest model no larger one beats by more than min_gain."""
    losses = [run.train_loss for run in runs]
    return next(i for i in range(len(runs)) if all(losses[i] - later <= min_gain for later in losses[i + 1 :]))


def capacity_finding(shapes: list[Shape], runs: list[SubRun], min_gain: float, chance: float | None = None) -> Finding:
    index = saturation(runs, min_gain)
    shape, run = shapes[index], runs[index]
    observed = f"saturates at {shape.name} ({run.num_params:,} params, train loss {run.train_loss:.4f}); best {min(r.train_loss for r in runs):.4f}"
    expected = f"every shape trains below chance; the saturation point: no larger model beats it by more than {min_gain:.3g} nats"
    if all(at_chance(r.train_loss, chance) for r in runs):
        return Finding(
            "capacity",
            Status.WARNING,
            observed + f"; chance ln C = {chance:.3f}",
            expected,
            "no shape leaves chance at this compute: the losses compared are an untrained model's, so the saturation point says nothing",
            "raise check.stages.capacity.budget_steps, or check the lr (check=lr_range)",
        )
    if index == len(runs) - 1:
        observed += "; still falling at the largest shape: capacity-bound at this compute (a larger model trains better)"
    return Finding("capacity", Status.PASSED, observed, expected)


def noise_gain(ctx: StageContext, min_gain: float) -> float:
    """The gain a larger model needs to count: min_gain, or the 95% noise of a difference of two single runs
    when the seeds stage measured the seed std."""
    std = ctx.measured.get("seed_std")
    return max(min_gain, 1.96 * math.sqrt(2) * std) if std is not None and math.isfinite(std) else min_gain


class Capacity(Stage):
    """Width x depth at fixed compute, train loss against parameters, saturation point. Thresholds: CapacityConfig."""

    name = "capacity"
    needs_components = False

    def __init__(self, widths: list[int] = (64, 128, 192), depths: list[int] = (2, 4), budget_steps: int = 50, min_steps: int = 10, min_gain: float = 0.02):
        self.widths, self.depths, self.budget_steps, self.min_steps, self.min_gain = list(widths), list(depths), budget_steps, min_steps, min_gain
        self.configured_steps = budget_steps
        self.sizes: tuple[int, list[int]] | None = None
        """(the configured model's parameters, each shape's), once the plan has counted them."""
        self.runs: list[SubRun] = []

    scalable = True
    FLOOR = 10
    """Fewest steps' compute a budget leaves the configured model (each shape trains at least min_steps)."""

    def cost(self, ctx: StageContext, costs) -> float:
        from currytrain.estimate import count_parameters

        if "dim" not in ctx.cfg.model:
            return 0.0
        if self.sizes is None:  # sized on the meta device once: the plan asks for the cost at many budgets
            self.sizes = (count_parameters(ctx.cfg.model), [shape.num_params for shape in plan(ctx, self.widths, self.depths, 1, 1)])
        configured, sizes = self.sizes
        return sum(costs.subrun(max(self.min_steps, round(configured * self.budget_steps / size)), params=size) for size in sizes)

    def scale(self, factor: float) -> None:
        self.budget_steps = scaled(self.configured_steps, factor, self.FLOOR)

    def planned_steps(self) -> str | None:
        return steps_text(self.configured_steps, self.budget_steps, "steps' compute")

    def assess(self, parts: Components | None, ctx: StageContext) -> StageResult:
        result = StageResult(self.name)
        if "dim" not in ctx.cfg.model:
            result.findings.append(width_skipped("capacity"))
            return result
        min_gain = noise_gain(ctx, self.min_gain)
        shapes = plan(ctx, self.widths, self.depths, self.budget_steps, self.min_steps)
        self.runs = [train_subrun(ctx, self.name, shape.name, shape.overrides(ctx.cfg.model)) for shape in shapes]
        failed = [run.name for run in self.runs if not run.finished]
        if failed:
            finding = Finding(
                "capacity", Status.FAILED, f"runs that did not finish: {', '.join(failed)}", "every shape trains", "a shape diverged", "lower optimizer.lr"
            )
            result.findings.append(finding)
            return result
        chance = data_chance(shared_data(ctx, ctx.cfg))
        result.findings.append(capacity_finding(shapes, self.runs, min_gain, chance))
        if ctx.state.is_main:
            index = saturation(self.runs, min_gain)
            marks = {"saturation": (self.runs[index].num_params, self.runs[index].train_loss)}
            xs, ys = [r.num_params for r in self.runs], [r.train_loss for r in self.runs]
            path = Path(ctx.run_dir) / "capacity.png"
            labels = ("parameters N", "train loss (nats/token)")
            result.figures.append(figures.scatter_fit(path, xs, ys, None, labels, "capacity at fixed compute", marks, chance))
        rows = [f"| {s.name} | {r.num_params:,} | {s.steps} | {r.train_loss:.4f} | {r.val_loss:.4f} |" for s, r in zip(shapes, self.runs)]
        result.details = "\n".join(["| shape | parameters | steps | train loss (last 10%) | val loss |", "|---|---:|---:|---:|---:|", *rows])
        return result
