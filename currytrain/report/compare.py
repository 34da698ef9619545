"""`currytrain compare`: runs grouped by what they compute (seeds of one config form a group), their
config differences, final metrics, overlaid curves, and a verdict that accounts for seed noise.

Each argument is a run folder or a folder of runs (a multirun or a sweep). With several arguments, runs
from different arguments are never pooled. The verdict compares every group with the first one on the
final val loss: the difference of means with a Welch 95% interval; "within seed noise" when the interval
holds 0. A group with a single seed has no noise estimate, so no verdict is given; instead the report
says how many seeds per config the measured noise would need (80% power, two-sided 5% test).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from currytrain.report.runs import Run, find_runs

Z_95, Z_80 = 1.959964, 0.841621
"""Normal quantiles: two-sided 5% test, 80% power."""


@dataclass
class Group:
    name: str
    runs: list[Run]

    @property
    def values(self) -> list[float]:
        return [run.final_val_loss for run in self.runs if math.isfinite(run.final_val_loss)]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if len(self.values) >= 2 else math.nan


@dataclass
class Verdict:
    group: str
    baseline: str
    difference: float
    """mean(group) - mean(baseline): negative is a lower (better) loss."""
    half_width: float
    """Half the 95% interval of the difference; nan without seeds to estimate it."""
    text: str


def group_runs(arguments: dict[str, list[Run]]) -> list[Group]:
    """Seeds of one config form a group; runs from different arguments are never pooled. A group is named
    by its config's difference from the first group's (and by its argument when there are several)."""
    groups: dict[tuple, list[Run]] = {}
    for location, runs in arguments.items():
        for run in runs:
            groups.setdefault((location, run.experiment_key()), []).append(run)
    reference = next(iter(groups.values()))[0]
    named = []
    for (location, _), runs in groups.items():
        label = " ".join(f"{key}={value}" for key, value in _config_diff(reference, runs[0]).items())
        if len(arguments) > 1:
            label = f"{Path(location).name}" + (f" ({label})" if label else "")
        named.append(Group(label or "baseline", runs))
    return named


def _config_diff(reference: Run, other: Run) -> dict[str, object]:
    keys = dict(reference.experiment_key()), dict(other.experiment_key())
    return {k: keys[1].get(k) for k in sorted(set(keys[0]) | set(keys[1])) if keys[0].get(k) != keys[1].get(k)}


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """(mean(b) - mean(a), half-width of its Welch 95% interval)."""
    from scipy import stats

    var_a, var_b = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    spread = math.sqrt(var_a + var_b)
    if spread == 0:
        return statistics.fmean(b) - statistics.fmean(a), 0.0
    dof = (var_a + var_b) ** 2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    return statistics.fmean(b) - statistics.fmean(a), float(stats.t.ppf(0.975, dof)) * spread


def seeds_needed(noise: float, effect: float) -> int:
    """Seeds per config for a two-sided 5% test to detect `effect` with 80% power, at seed std `noise`."""
    if not effect:
        return math.inf
    return max(2, math.ceil(2 * (Z_95 + Z_80) ** 2 * noise**2 / effect**2))


def verdicts(groups: list[Group]) -> list[Verdict]:
    baseline, results = groups[0], []
    noises = [g.std for g in groups if len(g.values) >= 2]
    noise = statistics.fmean(noises) if noises else math.nan
    for group in groups[1:]:
        difference = group.mean - baseline.mean
        if len(group.values) < 2 or len(baseline.values) < 2:
            if math.isfinite(noise):
                need = seeds_needed(noise, difference)
                advice = f"the seed noise measured here (std {noise:.4f}) needs {need} seeds per config to tell a difference of {abs(difference):.4f}"
            else:
                advice = "no group has two seeds, so the seed noise is unknown: run at least 3 seeds per config (python launch.py -m seed=0,1,2 ...)"
            results.append(Verdict(group.name, baseline.name, difference, math.nan, f"no verdict from single seeds: {advice}"))
            continue
        difference, half = welch(baseline.values, group.values)
        if abs(difference) > half:
            word = "better" if difference < 0 else "worse"
            text = f"{group.name} is {word} than {baseline.name} by {abs(difference):.4f} ± {half:.4f} nats (95%, Welch)"
        else:
            text = f"within seed noise: {difference:+.4f} ± {half:.4f} nats (95%, Welch) holds 0"
        results.append(Verdict(group.name, baseline.name, difference, half, text))
    return results


def compare(locations: list[str], out: Path) -> tuple[list[Group], list[Verdict], Path]:
    """Group, compare and write report.md (+ curves.png) into `out`; returns what it found."""
    groups = group_runs({location: find_runs(location) for location in locations})
    found = verdicts(groups)
    out.mkdir(parents=True, exist_ok=True)
    figure = _plot(groups, out / "curves.png")
    (out / "report.md").write_text(_report(groups, found, figure))
    return groups, found, out / "report.md"


def _report(groups: list[Group], found: list[Verdict], figure: Path | None) -> str:
    lines = ["# Comparison", "", "| group | runs | final val loss (mean ± std) | endings |", "|---|---|---|---|"]
    for group in groups:
        endings = ", ".join(sorted({run.ending for run in group.runs}))
        std = f" ± {group.std:.4f}" if math.isfinite(group.std) else ""
        lines.append(f"| {group.name} | {len(group.runs)} | {group.mean:.4f}{std} | {endings} |")
    lines += ["", "## Verdicts", ""] + [f"- {verdict.text}" for verdict in found] + [""]
    if figure:
        lines += ["## Curves", "", f"![train loss and gradient norm]({figure.name})", ""]
    lines += ["## Runs", ""] + [f"- {group.name}: " + ", ".join(str(run.path) for run in group.runs) for group in groups]
    return "\n".join(lines) + "\n"


def _plot(groups: list[Group], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for index, group in enumerate(groups):
        color = f"C{index % 10}"
        for number, run in enumerate(group.runs):
            label = group.name if number == 0 else None
            axes[0].plot(*run.curve("train/loss"), color=color, alpha=0.7, label=label)
            axes[1].plot(*run.curve("train/grad_norm"), color=color, alpha=0.7, label=label)
    for axis, title in zip(axes, ("train loss (nats/token)", "gradient norm")):
        axis.set_title(title)
        axis.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
