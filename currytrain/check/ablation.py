"""Stage ablation: a small A/B of baseline against an idea, over seeds, before the idea gets a full run.

The idea is a list of overrides of the configured run: values (`check.stages.ablation.idea=[optimizer.lr=0.01]`)
or other options of groups and experiment files (`idea=[model=moe]`, `idea=[experiment=my_idea]`), for which the
arm is composed again by Hydra from the run's own overrides plus the idea's.
Both arms train the same seeds at a small budget, so the verdict (currytrain.stats, as `currytrain compare`
decides) pairs them by seed: a paired t-test on the per-seed differences of the final val loss, at alpha
0.05. Seed-to-seed spread that both arms share cancels; Welch's interval, which ignores the pairing, would be
several times wider. Next to the expected gain stands the cost of one full run of the configured
trainer.max_steps: its wall time here, from the step time the arms measured, and its device-hours and
money on cfg.cost (`currytrain estimate`).
Gate: an idea that is worse fails; inconclusive warns (with the seeds that would settle it); better passes.
"""

from __future__ import annotations

import statistics

from currytrain.check.budget import scaled, steps_text
from currytrain.check.probes import at_chance, data_chance
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status
from currytrain.check.subruns import SubRun, arm_config, budget_overrides, run_seeds, shared_data
from currytrain.components import Components
from currytrain.stats import BETTER, WORSE, Verdict, decide


def verdict(baseline: list[float], idea: list[float], name: str = "idea") -> Verdict:
    """The idea against the baseline, paired by seed (both lists in the same seed order)."""
    return decide(baseline, idea, paired=True, names=("baseline", name), unit="nats")


def full_run_seconds(runs: list[SubRun], sub_steps: int, full_steps: int) -> float:
    """Seconds one full run of `full_steps` would take here, from the arms' measured seconds per step."""
    per_step = statistics.median(run.seconds / sub_steps for run in runs)
    return per_step * full_steps


def _mean(values: list[float]) -> float:
    """The mean, divided before it is summed: losses near float's range do not overflow (fmean's fsum would raise)."""
    return sum(value / len(values) for value in values)


def ablation_finding(idea: list[str], base: list[SubRun], arm: list[SubRun], full_seconds: float, chance: float | None = None) -> Finding:
    expected = "the idea lowers the final val loss beyond seed noise (paired t over the shared seeds, p < 0.05)"
    unfinished = [run.name for run in base + arm if not run.finished]
    if unfinished:
        return Finding(
            "ablation",
            Status.FAILED,
            f"runs that did not finish: {', '.join(unfinished)}",
            expected,
            "an arm diverged or was aborted",
            "check the idea's overrides (a higher lr?); run check=lr_range on the idea",
        )
    a, b = [run.val_loss for run in base], [run.val_loss for run in arm]
    found = verdict(a, b, " ".join(idea))
    observed = (
        f"{' '.join(idea)}: {found.word}, {found.numbers} (idea {_mean(b):.4f} vs baseline {_mean(a):.4f}); a full run costs ~{full_seconds / 60:.1f} min here"
    )
    if at_chance(_mean(a), chance) and at_chance(_mean(b), chance):
        return Finding(
            "ablation",
            Status.WARNING,
            observed + f"; chance ln C = {chance:.3f}",
            expected,
            "neither arm leaves chance at this budget: the comparison is between two untrained models and says nothing about the idea",
            "raise check.stages.ablation.max_steps, or check the lr (check=lr_range)",
        )
    if found.word == WORSE:
        return Finding("ablation", Status.FAILED, observed, expected, "the idea is worse than the baseline at this budget", "drop or rethink the idea")
    if found.word == BETTER:
        return Finding("ablation", Status.PASSED, observed, expected)
    return Finding(
        "ablation",
        Status.WARNING,
        observed,
        expected,
        f"inconclusive: the difference is within seed noise at this budget; {found.advice()}",
        "more seeds (check.stages.ablation.seeds) or a longer budget (check.stages.ablation.max_steps) before a full run",
    )


class Ablation(Stage):
    """Baseline vs idea over seeds at a small budget. Thresholds: AblationConfig's fields."""

    name = "ablation"
    needs_components = False

    def __init__(self, idea: list[str] = (), seeds: int = 3, max_steps: int | None = 100, baseline: list[str] = ()):
        self.idea, self.seeds, self.max_steps, self.baseline = list(idea), seeds, max_steps, list(baseline)
        self.configured_steps = max_steps
        self.verdict: Verdict | None = None
        """The last assessment's verdict (paired by seed)."""

    scalable = True
    FLOOR = 40
    """Fewest steps a budget leaves each arm's runs."""

    def cost(self, ctx: StageContext, costs) -> float:
        return 2 * self.seeds * costs.subrun(self.max_steps or int(ctx.cfg.trainer.max_steps)) if self.idea else 0.0

    def scale(self, factor: float) -> None:
        if self.configured_steps:
            self.max_steps = scaled(self.configured_steps, factor, self.FLOOR)

    def planned_steps(self) -> str | None:
        return steps_text(self.configured_steps, self.max_steps) if self.idea else None

    def assess(self, parts: Components | None, ctx: StageContext) -> StageResult:
        result = StageResult(self.name)
        if not self.idea:
            result.findings.append(Finding("ablation", Status.SKIPPED, "no idea given", "check.stages.ablation.idea=[<override>,...] to compare an idea"))
            return result
        for arm in (self.baseline, self.baseline + self.idea):
            arm_config(ctx, arm)  # an unknown option fails here (ConfigError), before any arm trains
        seeds = [int(ctx.cfg.seed) + i for i in range(self.seeds)]
        budget = budget_overrides(self.max_steps, [])
        base = run_seeds(ctx, self.name, "baseline_", seeds, budget + self.baseline)
        arm = run_seeds(ctx, self.name, "idea_", seeds, budget + self.baseline + self.idea)
        steps = self.max_steps or int(ctx.cfg.trainer.max_steps)
        full = full_run_seconds(base + arm, steps, int(ctx.cfg.trainer.max_steps))
        finding = ablation_finding(self.idea, base, arm, full, data_chance(shared_data(ctx, ctx.cfg)))
        finding.observed += f"; on {ctx.cfg.cost.name}: {_priced(ctx)}" if "cost" in ctx.cfg else ""
        if all(run.finished for run in base + arm):
            self.verdict = verdict([r.val_loss for r in base], [r.val_loss for r in arm], " ".join(self.idea))
        result.findings.append(finding)
        result.details = arms_table(base, arm) + f"\n\nThe arms are run folders: `currytrain compare {ctx.run_dir}/{self.name}`."
        return result


def _priced(ctx: StageContext) -> str:
    """The full run's time and money on cfg.cost (currytrain estimate), next to the expected gain."""
    from currytrain.cost.estimate import estimate_cost

    estimate = estimate_cost(ctx.cfg, measure_steps=3)
    return f"{estimate.device_hours:,.2f} device-hours, ${estimate.money:,.2f} ({estimate.method})"


def arms_table(base: list[SubRun], arm: list[SubRun]) -> str:
    lines = ["| arm | seed run | final val loss | seconds |", "|---|---|---:|---:|"]
    for label, runs in (("baseline", base), ("idea", arm)):
        lines += [f"| {label} | {run.name} | {run.val_loss:.4f} | {run.seconds:.1f} |" for run in runs]
    return "\n".join(lines)
