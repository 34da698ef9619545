"""Stage seeds: the same config trained with k seeds at a small budget, to measure trial-to-trial noise.

Reports the mean, std and 95% interval (Student t) of the final val loss, and the smallest difference
between two configs that k seeds each can detect (two-sided t-test at alpha 0.05, 80% power, unpaired: exact,
from the noncentral t; currytrain.stats.detectable_effect, the inverse of `currytrain compare`'s seeds-needed
advice). Paired seeds detect less: the spread both configs share cancels. The seed runs are run folders
under <run>/seeds/, so `currytrain compare <run>/seeds` reads them. Gate: every seed finishes (a seed that
diverges means the config is unstable at this lr); a noise that is a large share of the loss itself
(`max_std_share` of the chance loss ln C, C the data's classes) warns, or above `max_std` nats when that is set. The std is handed to later stages (ctx.measured), so that the scaling gate weighs its held-out
size against the noise measured in the same run.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from currytrain.check.budget import scaled, steps_text
from currytrain.check.probes import at_chance, data_chance
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status
from currytrain.check.subruns import SubRun, budget_overrides, run_seeds, shared_data
from currytrain.components import Components
from currytrain.stats import detectable_effect


@dataclass
class SeedStats:
    values: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if len(self.values) >= 2 else math.nan

    @property
    def half_width(self) -> float:
        """Half the 95% interval of the mean (Student t with k-1 degrees of freedom)."""
        from scipy import stats

        k = len(self.values)
        return float(stats.t.ppf(0.975, k - 1)) * self.std / math.sqrt(k) if k >= 2 else math.nan

    def detectable(self, k: int | None = None) -> float:
        """Smallest difference of means k seeds per config detect (t-test, alpha 0.05, 80% power, unpaired)."""
        return detectable_effect(self.std, k or len(self.values))


def seeds_finding(runs: list[SubRun], max_std: float | None, chance: float | None = None, max_std_share: float = 0.1) -> Finding:
    failed = [run for run in runs if not run.finished]
    done = SeedStats([run.val_loss for run in runs if run.finished])
    if max_std is None:
        limit = max_std_share * chance if chance is not None and math.isfinite(chance) and chance > 0 else math.inf
        rule = f"std <= {max_std_share:g} x ln C = {limit:.3g} nats" if math.isfinite(limit) else "no std limit (classes unknown)"
    else:
        limit, rule = max_std, f"std <= {max_std:g} nats"
    expected = f"every seed finishes; {rule}"
    if failed:
        names = ", ".join(run.name for run in failed)
        return Finding(
            "seed variance",
            Status.FAILED,
            f"{len(failed)}/{len(runs)} seeds did not finish ({names}): {failed[0].message[:200]}",
            expected,
            "training is unstable at this config: some seeds diverge",
            "lower optimizer.lr, raise optimizer.schedule.warmup_steps or set trainer.grad_clip=1.0 (run check=lr_range)",
        )
    observed = (
        f"final val loss {done.mean:.4f} ± {done.half_width:.4f} (95% CI), std {done.std:.4f} over {len(runs)} seeds; "
        f"smallest detectable difference with {len(runs)} seeds: {done.detectable():.4f} nats (unpaired t, alpha 0.05, 80% power)"
    )
    if at_chance(done.mean, chance):
        return Finding(
            "seed variance",
            Status.WARNING,
            observed,
            expected + f"; a mean below chance ln C = {chance:.3f}",
            f"the seeds end at chance (mean {done.mean:.4f} against ln C = {chance:.3f}): the model has not learned at this budget, so the "
            "noise measured is an untrained model's and the stages that weigh their evidence against it (scaling, capacity) rest on it",
            "raise check.stages.seeds.max_steps (and the scaling budget with it), or check the lr (check=lr_range) and the data",
        )
    if done.std > limit:
        return Finding(
            "seed variance",
            Status.WARNING,
            observed,
            expected,
            f"the seed noise ({done.std:.3g} nats) is a large share of the loss itself: seeds end far apart, so training is unstable "
            "(a seed that spikes or stalls), and small improvements will be indistinguishable from luck",
            "run more seeds per config, a longer budget (check.stages.seeds.max_steps) or a larger eval (trainer.eval_batches)",
        )
    return Finding("seed variance", Status.PASSED, observed, expected)


def seeds_table(runs: list[SubRun]) -> str:
    lines = ["| run | final val loss | seconds | folder |", "|---|---:|---:|---|"]
    lines += [f"| {run.name} | {run.val_loss:.4f} | {run.seconds:.1f} | {run.path.name} |" for run in runs]
    return "\n".join(lines)


class Seeds(Stage):
    """k seeds of the config at a small budget: mean, std, 95% CI, detectable effect. Thresholds: SeedsConfig."""

    name = "seeds"
    needs_components = False

    def __init__(self, seeds: int = 3, max_steps: int | None = 100, max_std: float | None = None, max_std_share: float = 0.1, overrides: list[str] = ()):
        self.seeds, self.max_steps, self.max_std, self.max_std_share, self.overrides = seeds, max_steps, max_std, max_std_share, list(overrides)
        self.configured_steps = max_steps
        self.runs: list[SubRun] = []

    scalable = True
    FLOOR = 40
    """Fewest steps a budget leaves each seed (the scaling runs, whose noise these seeds measure, keep as many)."""

    def cost(self, ctx: StageContext, costs) -> float:
        return self.seeds * costs.subrun(self.max_steps or int(ctx.cfg.trainer.max_steps))

    def scale(self, factor: float) -> None:
        if self.configured_steps:
            self.max_steps = scaled(self.configured_steps, factor, self.FLOOR)

    def planned_steps(self) -> str | None:
        return steps_text(self.configured_steps, self.max_steps)

    def assess(self, parts: Components | None, ctx: StageContext) -> StageResult:
        result = StageResult(self.name)
        base = int(ctx.cfg.seed)
        self.runs = run_seeds(ctx, self.name, "", [base + i for i in range(self.seeds)], budget_overrides(self.max_steps, self.overrides))
        result.findings.append(seeds_finding(self.runs, self.max_std, data_chance(shared_data(ctx, ctx.cfg)), self.max_std_share))
        finished = [run.val_loss for run in self.runs if run.finished]
        if len(finished) >= 2:
            ctx.measured.update(seed_std=statistics.stdev(finished), seed_count=len(finished), seed_mean=statistics.fmean(finished), seed_steps=self.max_steps)
        result.details = seeds_table(self.runs) + f"\n\nThe seed runs are run folders: `currytrain compare {ctx.run_dir}/{self.name}`."
        return result
