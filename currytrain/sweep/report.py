"""What a sweep leaves in its folder: optimization_results.yaml (as hydra-optuna-sweeper writes it), report.md
(trials table, best trial and whether it is distinguishable from the runner-up, parameter importances) and
optimization_history.png."""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

log = logging.getLogger(__name__)

RESULTS = "optimization_results.yaml"
REPORT = "report.md"
HISTORY_PNG = "optimization_history.png"


def _finished(study: Any) -> list[Any]:
    return [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]


def _complete(study: Any) -> list[Any]:
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]


def results(study: Any) -> dict[str, Any]:
    """The best trial (single objective) or the Pareto front (several), plus the count of trials by state."""
    counts: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
    out: dict[str, Any] = {"name": "optuna", "study_name": study.study_name, "trials": counts}
    if not _complete(study):
        return out
    if len(study.directions) == 1:
        best = study.best_trial
        out.update(best_params=dict(best.params), best_value=float(best.value), best_trial=best.number, best_run_dir=best.user_attrs.get("run_dir"))
    else:
        out["solutions"] = [{"params": dict(t.params), "values": [float(v) for v in t.values], "trial": t.number} for t in study.best_trials]
    return out


def _value_text(trial: Any) -> str:
    if trial.values is None:
        return "-"
    return ", ".join(f"{v:.4f}" for v in trial.values)


def _param_text(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trials_table(study: Any, objectives: Sequence[str]) -> list[str]:
    trials = study.get_trials(deepcopy=False)
    keys = sorted({k for t in trials for k in t.params})
    lines = [
        "| trial | state | " + " | ".join(objectives) + " | last step | " + " | ".join(keys) + " | reason |",
        "|---" * (4 + len(objectives) + len(keys)) + "|",
    ]
    for t in trials:
        step = trained_steps(t)
        params = " | ".join(_param_text(t.params[k]) if k in t.params else "-" for k in keys)
        reason = str(t.user_attrs.get("reason", "")).replace("|", "/").replace("\n", " ")[:160]
        lines.append(f"| {t.number} | {t.state.name} | {_value_text(t)} | {step} | {params} | {reason} |")
    return lines


def trained_steps(trial: Any) -> int | str:
    """The last step the trial's run trained (its journal's), else the last it reported to the pruner (which sees the
    evals only, so not a final step past the last eval), else '-'."""
    from currytrain.journal import current, read_journal

    journal = Path(trial.user_attrs.get("run_dir") or "/nonexistent") / "journal.jsonl"
    try:
        steps = [record["step"] for record in current(read_journal(journal)) if record.get("type") in ("metrics", "eval", "finish") and "step" in record]
    except (OSError, ValueError, KeyError):
        steps = []
    if steps:
        return max(steps)
    return trial.last_step if trial.last_step is not None else "-"


def importances(study: Any) -> dict[str, float] | None:
    """Parameter importances (fANOVA, else PED-ANOVA), or None when they cannot be computed (too few trials)."""
    import optuna

    if len(study.directions) != 1 or len(_complete(study)) < 3:
        return None
    # fANOVA needs scikit-learn (not a dependency); PED-ANOVA needs nothing more than optuna.
    for evaluator in ("FanovaImportanceEvaluator", "PedAnovaImportanceEvaluator"):
        try:
            found = optuna.importance.get_param_importances(study, evaluator=getattr(optuna.importance, evaluator)())
            return {name: float(value) for name, value in found.items()}
        except Exception as error:  # a missing optional dependency, a degenerate space
            log.debug("importance by %s not computable: %s", evaluator, error)
    return None


def plot_history(study: Any, objectives: Sequence[str], path: Path) -> bool:
    """Objective per trial and the best so far (first objective); False when there is nothing to draw."""
    complete = [t for t in _complete(study) if t.values and math.isfinite(t.values[0])]
    if not complete:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numbers, values = [t.number for t in complete], [t.values[0] for t in complete]
    pick = min if study.directions[0].name == "MINIMIZE" else max
    best = [pick(values[: i + 1]) for i in range(len(values))]
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.scatter(numbers, values, label="trial", s=18)
    axes.step(numbers, best, where="post", color="C1", label="best so far")
    axes.set_xlabel("trial")
    axes.set_ylabel(objectives[0])
    axes.set_title(f"study {study.study_name}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


SEED_PARAMS = ("seed", "data.seed")


def _config_of(trial: Any) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in trial.params.items() if k not in SEED_PARAMS))


def best_vs_runner_up(study: Any, objective: str) -> str:
    """Whether the best config is distinguishable from the runner-up (currytrain.stats): trials of one config
    with several seeds are its samples; a config seen with one seed only cannot be told from seed noise."""
    from currytrain.stats import decide

    complete = [t for t in _complete(study) if t.values and math.isfinite(t.values[0])]
    configs: dict[tuple, dict[Any, float]] = {}
    for trial in complete:
        configs.setdefault(_config_of(trial), {})[trial.params.get("seed", trial.number)] = trial.values[0]
    maximize = study.directions[0].name == "MAXIMIZE"
    ranked = sorted(configs.items(), key=lambda item: statistics.fmean(item[1].values()), reverse=maximize)
    if len(ranked) < 2:
        return "One config only: no runner-up to compare with."
    (best, best_runs), (second, second_runs) = ranked[:2]
    names = [" ".join(f"{k}={v}" for k, v in config) or "the config" for config in (second, best)]
    if min(len(best_runs), len(second_runs)) < 2:
        gap = abs(statistics.fmean(best_runs.values()) - statistics.fmean(second_runs.values()))
        return (
            f"Best ({names[1]}) vs runner-up ({names[0]}): {objective} gap {gap:.4f}, not distinguishable yet: "
            f"{len(best_runs)} and {len(second_runs)} seed(s), so the gap cannot be told from seed noise. Rerun both "
            "with seeds: the same sweep command with sweep.confirm_top_k=2 does it (the study is not rerun), or "
            "python launch.py -m seed=0,1,2 <params> and `currytrain compare` the folders."
        )
    shared = sorted(set(best_runs) & set(second_runs), key=str)
    paired = len(shared) >= 2
    baseline, candidate = (
        ([second_runs[s] for s in shared], [best_runs[s] for s in shared]) if paired else (list(second_runs.values()), list(best_runs.values()))
    )
    verdict = decide(baseline, candidate, paired=paired, direction="maximize" if maximize else "minimize", names=(names[0], names[1]))
    return f"Best vs runner-up on {objective}: {verdict.text}."


def report_lines(study: Any, objectives: Sequence[str], summary: dict[str, Any], drew: bool, confirmation: Any = None) -> list[str]:
    lines = [f"# Sweep report: study {study.study_name}", "", f"Trials by state: {summary['trials']}", ""]
    if "best_value" in summary:
        lines += [
            f"## Best trial: {summary['best_trial']}",
            "",
            f"{objectives[0]} = {summary['best_value']:.4f}, run folder `{summary['best_run_dir']}`",
            "",
        ]
        lines += [f"- `{k}={_param_text(v)}`" for k, v in summary["best_params"].items()] + [""]
        lines += [best_vs_runner_up(study, objectives[0]), ""]
    if confirmation is not None:
        lines += confirmation.lines(objectives[0])
    elif "solutions" in summary:
        lines += ["## Pareto front", ""] + [f"- trial {s['trial']}: {s['values']} {s['params']}" for s in summary["solutions"]] + [""]
    found = importances(study)
    lines += ["## Parameter importances", ""]
    lines += [f"- {k}: {v:.3f}" for k, v in found.items()] if found else ["Not computable yet (needs 3 complete trials, one objective)."]
    lines += ["", "## Trials", "", *trials_table(study, objectives), ""]
    if drew:
        lines += ["## Optimization history", "", f"![history]({HISTORY_PNG})", ""]
    return lines


def write_outputs(study: Any, sweep_dir: Path, objectives: Sequence[str], confirmation: Any = None) -> dict[str, Any]:
    """optimization_results.yaml, optimization_history.png and report.md; `confirmation` (sweep.confirm) adds
    the reruns of the top configs and the winner they name."""
    summary = results(study)
    if confirmation is not None:
        summary["confirmation"] = confirmation.summary()
    OmegaConf.save(OmegaConf.create(summary), sweep_dir / RESULTS)
    drew = plot_history(study, objectives, sweep_dir / HISTORY_PNG)
    (sweep_dir / REPORT).write_text("\n".join(report_lines(study, objectives, summary, drew, confirmation)))
    log.info("sweep results: %s, report: %s", sweep_dir / RESULTS, sweep_dir / REPORT)
    return summary
