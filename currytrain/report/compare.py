"""`currytrain compare`: runs grouped by what they compute, what differs between the groups, final metrics,
overlaid curves, and one verdict per group against a baseline, decided by currytrain.stats.

Each argument is a run folder or a folder of runs (a multirun or a sweep); any mix is read as one pool. Runs
whose resolved configs agree once the seed and the keys that do not change the experiment (output, logging,
progress, the launching sweep: runs.IRRELEVANT_PREFIXES) are set aside are seeds of one group. Each group is
compared with the baseline (the first group, or `baseline=`) on the final value of `metric`: paired by seed
(paired t, or Wilcoxon) when the two share at least two seeds, Welch's t otherwise, Holm-corrected over the
groups. A group with a single seed gets no verdict, only how many seeds the measured noise would need.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from currytrain.errors import ConfigError
from currytrain.report.runs import Run, find_runs
from currytrain.stats import DIRECTIONS, TESTS, Verdict, bootstrap_interval, decide_many, no_verdict

OUT = "compare"
"""The folder, beside the runs read, that report.md and curves.png go to unless --out says otherwise."""


@dataclass
class Group:
    name: str
    runs: list[Run]
    metric: str = "val_loss"

    @property
    def by_seed(self) -> dict[int | None, float]:
        """The final metric per seed (the mean over runs of one seed), finished runs only."""
        values: dict[int | None, list[float]] = {}
        for run in self.runs:
            value = run.final(self.metric)
            if value is not None and math.isfinite(value):
                values.setdefault(run.seed, []).append(value)
        return {seed: statistics.fmean(v) for seed, v in values.items()}

    @property
    def values(self) -> list[float]:
        return list(self.by_seed.values())

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if len(self.values) >= 2 else math.nan


@dataclass
class Comparison:
    groups: list[Group]
    baseline: Group
    verdicts: list[Verdict]
    notes: list[str]
    """Groups without a verdict (a single seed), and why."""
    differs: dict[str, list[str]]
    """Config keys whose value differs between groups: {key: the value in each group, in group order}."""
    metric: str
    direction: str
    alpha: float
    report: Path | None = None
    lines: list[str] = field(default_factory=list)
    """Every verdict and note as one line, in group order."""


def load(locations: list[str], skipped: list[str] | None = None) -> list[Run]:
    """Every run below every location; all bad locations reported at once. Below a folder, a run that cannot be
    read is left out and said in `skipped`, as is each damaged journal line of the runs read."""
    runs, problems = [], []
    for location in locations:
        try:
            runs += find_runs(location, skipped)
        except ConfigError as error:
            problems.append(str(error))
    if problems:
        raise ConfigError("\n".join(problems))
    if skipped is not None:
        skipped += [f"{run.path / 'journal.jsonl'} {line} (skipped)" for run in runs for line in run.skipped]
    return runs


def group_runs(runs: list[Run], metric: str = "val_loss") -> tuple[list[Group], dict[str, list[str]]]:
    """Seeds of one config form a group, in order of first appearance; each is named by its values of the keys
    that differ between groups."""
    keyed: dict[tuple, list[Run]] = {}
    for run in runs:
        keyed.setdefault(run.experiment_key(), []).append(run)
    configs = [dict(key) for key in keyed]
    keys = sorted({k for config in configs for k in config})
    differs = {k: [config.get(k, "(unset)") for config in configs] for k in keys if len({config.get(k, "(unset)") for config in configs}) > 1}
    groups = []
    for index, members in enumerate(keyed.values()):
        label = " ".join(f"{k}={values[index]}" for k, values in differs.items())
        groups.append(Group(label or "runs", members, metric))
    return groups, differs


def check_metric(groups: list[Group], metric: str) -> None:
    """Every finished run must hold the metric: runs that log different metrics are not comparable on it."""
    finished = [run for group in groups for run in group.runs if run.ending == "finish"]
    if not finished:
        raise ConfigError("no run finished (no finish record in any journal): compare needs finished runs")
    lacking = [run for run in finished if run.final(metric) is None]
    if lacking:
        common = sorted(set.intersection(*(run.metric_names() for run in finished)))
        names = ", ".join(str(run.path) for run in lacking[:5]) + (f" and {len(lacking) - 5} more" if len(lacking) > 5 else "")
        raise ConfigError(f"--metric {metric}: {len(lacking)} of {len(finished)} finished runs never recorded it ({names}); pass --metric one of {common}")


def pick_baseline(groups: list[Group], name: str | None) -> Group:
    if name is None:
        return groups[0]
    found = [g for g in groups if g.name == name or any(Path(name).expanduser().resolve() == run.path.resolve() for run in g.runs)]
    if not found:
        raise ConfigError(f"--baseline {name} matches no group: pass one of {[g.name for g in groups]} (or a run folder of one)")
    return found[0]


def judge(groups: list[Group], baseline: Group, direction: str, alpha: float, delta: float | None, test: str) -> tuple[list[Verdict], list[str], list[str]]:
    """Verdicts (paired by seed where two groups share >= 2 seeds), notes for single-seed groups, and both as
    lines in group order."""
    noises = [g.std for g in groups if len(g.values) >= 2]
    noise = statistics.fmean(noises) if noises else math.nan
    tested, base_values, notes = {}, {}, {}
    for group in groups:
        if group is baseline:
            continue
        shared = sorted(set(group.by_seed) & set(baseline.by_seed) - {None}, key=int)
        if len(shared) >= 2:
            tested[group.name] = ([group.by_seed[s] for s in shared], True)
            base_values[group.name] = [baseline.by_seed[s] for s in shared]
        elif len(group.values) >= 2 and len(baseline.values) >= 2:
            tested[group.name] = (group.values, False)
            base_values[group.name] = baseline.values
        else:
            counts = {baseline.name: len(baseline.values), group.name: len(group.values)}
            notes[group.name] = no_verdict(group.name, baseline.name, counts, noise, group.mean - baseline.mean, alpha)
    found = decide_many(base_values, tested, alpha=alpha, direction=direction, delta=delta, test=test, baseline_name=baseline.name)
    texts = {verdict.candidate: verdict.text for verdict in found} | notes
    return found, list(notes.values()), [texts[g.name] for g in groups if g.name in texts]


def metric_direction(runs: list[Run], metric: str) -> str:
    """maximize when the runs' evaluations journal `metric` as higher-is-better (lm-eval's accuracy, say), else
    minimize (losses, perplexities, bits per byte)."""
    for run in runs:
        for event in reversed(run.events):
            better = event.get("higher_is_better")
            if isinstance(better, dict) and metric in better:
                return "maximize" if better[metric] else "minimize"
    return "minimize"


def default_out(runs: list[Run]) -> Path:
    """compare/ in the runs' common parent: beside them, never in the current directory."""
    return Path(os.path.commonpath([str(run.path.resolve().parent) for run in runs])) / OUT


def compare(
    locations: list[str],
    out: Path | None = None,
    metric: str = "val_loss",
    direction: str | None = None,
    baseline: str | None = None,
    alpha: float = 0.05,
    delta: float | None = None,
    test: str = "t",
) -> Comparison:
    """Group, judge and write report.md (+ curves.png) into `out` (default: beside the runs). Every input
    problem raises ConfigError before anything is written."""
    problems = []
    if direction is not None and direction not in DIRECTIONS:
        problems.append(f"--direction {direction}: choose one of {list(DIRECTIONS)}")
    if not 0 < alpha < 0.5:
        problems.append(f"--alpha {alpha}: choose a level in (0, 0.5): 0.05 by default, 0.01 for a claim worth a headline")
    if delta is not None and not delta > 0:
        problems.append(f"--delta {delta}: the equivalence margin must be > 0 (in the metric's unit)")
    if test not in TESTS:
        problems.append(f"--test {test}: choose one of {list(TESTS)}")
    if problems:
        raise ConfigError("\n".join(problems))
    skipped: list[str] = []
    runs = load(locations, skipped)
    direction = direction or metric_direction(runs, metric)
    groups, differs = group_runs(runs, metric)
    check_metric(groups, metric)
    chosen = pick_baseline(groups, baseline)
    found, notes, lines = judge(groups, chosen, direction, alpha, delta, test)
    result = Comparison(groups, chosen, found, notes + skipped, differs, metric, direction, alpha, lines=lines + skipped)
    out = Path(out) if out is not None else default_out(runs)
    out.mkdir(parents=True, exist_ok=True)
    figure = _plot(groups, out / "curves.png")
    result.report = out / "report.md"
    result.report.write_text(_report(result, figure))
    return result


def summary(group: Group) -> str:
    """'mean ± std [bootstrap 95% interval]' of the group's final metric."""
    values = group.values
    if not values:
        return "no finished run"
    if len(values) < 2:
        return f"{group.mean:.4f}"
    low, high = bootstrap_interval(values)
    return f"{group.mean:.4f} ± {group.std:.4f} [{low:.4f}, {high:.4f}]"


def _report(result: Comparison, figure: Path | None) -> str:
    lines = [
        "# Comparison",
        "",
        f"Final `{result.metric}` ({result.direction}), baseline `{result.baseline.name}`, alpha {result.alpha:g}. "
        "Groups sharing >= 2 seeds are paired by seed; others get Welch's t; p-values are Holm-corrected over the groups. "
        "See docs/compare.md.",
        "",
        f"| group | seeds | runs | {result.metric}: mean ± std [bootstrap 95%] | endings |",
        "|---|---:|---:|---|---|",
    ]
    for group in result.groups:
        endings = ", ".join(sorted({run.ending for run in group.runs}))
        lines.append(f"| {group.name} | {len(group.values)} | {len(group.runs)} | {summary(group)} | {endings} |")
    if result.differs:
        lines += ["", "## What differs", "", "| key | " + " | ".join(f"group {i + 1}" for i in range(len(result.groups))) + " |"]
        lines += ["|---" * (len(result.groups) + 1) + "|"] + [f"| {key} | " + " | ".join(values) + " |" for key, values in result.differs.items()]
    lines += ["", "## Verdicts", ""] + [f"- {line}" for line in result.lines or ["one group only: nothing to compare"]] + [""]
    if figure:
        lines += ["## Curves", "", f"![train loss and gradient norm]({figure.name})", ""]
    lines += ["## Runs", ""] + [f"- {group.name}: " + ", ".join(str(run.path) for run in group.runs) for group in result.groups]
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
