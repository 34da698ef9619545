"""sweep.confirm_top_k: before a sweep names its winner, the top k configs of the finished study are run again
with sweep.confirm_seeds fresh seeds each (the same seeds for every config), and the winner is named only where
the statistics core says it beats the others on those seeds (paired by seed, Holm-corrected over the others).

A sweep's best trial is the luckiest draw of many: its own value is biased low (for minimize), so the reruns use
seeds no trial used. They are not trials of the study (the sampler never sees them); they live in
<sweep dir>/confirm/trial_<n>/seed_<s>, where `currytrain compare` reads them like any run, and a rerun of the
sweep command reuses the ones that finished.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CONFIRM_DIR = "confirm"
SEED_KEY = "seed"


@dataclass
class Candidate:
    """One config of the study's top k: the trial that found it and its values on the confirmation seeds."""

    trial: int
    params: dict[str, Any]
    sweep_value: float
    values: dict[int, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"trial {self.trial}"

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values.values()) if self.values else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.values.values()) if len(self.values) > 1 else math.nan


@dataclass
class Confirmation:
    """The reruns of the top k configs, ranked by their mean over the confirmation seeds."""

    seeds: list[int]
    candidates: list[Candidate]
    maximize: bool
    alpha: float = 0.05
    verdicts: list[Any] = field(default_factory=list)

    @property
    def ranked(self) -> list[Candidate]:
        measured = [c for c in self.candidates if c.values]
        return sorted(measured, key=lambda c: c.mean, reverse=self.maximize)

    @property
    def winner(self) -> Candidate | None:
        """The best config when every other one is worse on the shared seeds; None when one is not."""
        ranked = self.ranked
        if not ranked or (len(ranked) > 1 and not (len(self.verdicts) == len(ranked) - 1 and all(v.word == "worse" for v in self.verdicts))):
            return None
        return ranked[0]

    def decide(self) -> None:
        """Each other config against the best by mean, paired on the seeds both finished (Holm over the others)."""
        from currytrain.stats import decide_many

        ranked = self.ranked
        if len(ranked) < 2:
            return
        best, others = ranked[0], ranked[1:]
        baseline, candidates = {}, {}
        for other in others:
            shared = [seed for seed in self.seeds if seed in best.values and seed in other.values]
            if len(shared) < 2:
                return  # no test without two shared seeds: no winner is named (the table shows the runs that finished)
            baseline[other.name] = [best.values[seed] for seed in shared]
            candidates[other.name] = ([other.values[seed] for seed in shared], True)
        direction = "maximize" if self.maximize else "minimize"
        self.verdicts = decide_many(baseline, candidates, alpha=self.alpha, direction=direction, baseline_name=best.name)

    def summary(self) -> dict[str, Any]:
        """What optimization_results.yaml records under `confirmation`."""
        winner = self.winner
        return {
            "seeds": list(self.seeds),
            "winner_trial": winner.trial if winner else None,
            "configs": [
                {"trial": c.trial, "params": dict(c.params), "sweep_value": c.sweep_value, "values": {int(s): float(v) for s, v in c.values.items()}}
                for c in self.candidates
            ],
        }

    def lines(self, objective: str) -> list[str]:
        """report.md's confirmation section."""
        lines = [
            f"## Confirmation: the top {len(self.candidates)} configs rerun at {len(self.seeds)} fresh seeds ({', '.join(map(str, self.seeds))})",
            "",
            f"| trial | {objective} in the sweep | mean over seeds | std | seeds finished | params |",
            "|---|---|---|---|---|---|",
        ]
        for c in self.ranked + [c for c in self.candidates if not c.values]:
            params = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in c.params.items())
            lines.append(f"| {c.trial} | {c.sweep_value:.4f} | {c.mean:.4f} | {c.std:.4f} | {len(c.values)}/{len(self.seeds)} | {params} |")
        lines.append("")
        lines += [f"- {verdict.text}" for verdict in self.verdicts]
        winner = self.winner
        if winner is not None:
            lines.append(f"\n**Winner: trial {winner.trial}** (mean {objective} {winner.mean:.4f} over {len(winner.values)} seeds).")
        elif len(self.ranked) >= 2:
            lines.append(
                f"\n**No winner named**: the best config by mean (trial {self.ranked[0].trial}) is not shown better than every other "
                f"at alpha={self.alpha}; raise sweep.confirm_seeds (each verdict above says what it could detect), or treat them as tied."
            )
        return [*lines, ""]


def top_candidates(study: Any, k: int) -> list[Candidate]:
    """The best trial of each of the k best distinct configs (the seed left out of a config's identity)."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE" and t.values and math.isfinite(t.values[0])]
    maximize = study.directions[0].name == "MAXIMIZE"
    complete.sort(key=lambda t: t.values[0], reverse=maximize)
    chosen: dict[tuple, Candidate] = {}
    for trial in complete:
        params = {key: value for key, value in trial.params.items() if key != SEED_KEY}
        identity = tuple(sorted((key, str(value)) for key, value in params.items()))
        if identity not in chosen:
            chosen[identity] = Candidate(trial.number, params, float(trial.values[0]))
        if len(chosen) == k:
            break
    return list(chosen.values())


def confirmation_seeds(config: Any, count: int) -> list[int]:
    """Seeds no trial of the study used: the ones right after the sweep's own seed."""
    base = int(config.get(SEED_KEY, 0) or 0)
    return [base + 1 + index for index in range(count)]


def run_dir_of(sweep_dir: Path, trial: int, seed: int) -> Path:
    return sweep_dir / CONFIRM_DIR / f"trial_{trial}" / f"seed_{seed}"


def confirm(
    study: Any,
    settings: dict[str, Any],
    config: Any,
    sweep_dir: Path,
    fixed: Sequence[str],
    launch: Callable[[list[list[str]], int], Sequence[Any]],
    outcome: Callable[[Any, Path], Any],
    finished: Callable[[Path], Any],
) -> Confirmation | None:
    """Rerun the study's top sweep.confirm_top_k configs at sweep.confirm_seeds seeds and decide between them.

    launch(overrides per job, first job index) runs a batch of jobs (Hydra's launcher); outcome(job return, run
    dir) and finished(run dir) read a job's Outcome (finished: from a run folder a previous sweep left, or None).
    """
    from currytrain.sweep.space import overrides_of

    k, count = int(settings.get("confirm_top_k") or 0), int(settings["confirm_seeds"])
    candidates = top_candidates(study, k) if k else []
    if not candidates:
        return None
    seeds = confirmation_seeds(config, count)
    jobs = []
    for candidate in candidates:
        for seed in seeds:
            run_dir = run_dir_of(sweep_dir, candidate.trial, seed)
            done = finished(run_dir)
            if done is not None and done.state == "COMPLETE":
                candidate.values[seed] = done.values[0]
                continue
            subdir = run_dir.relative_to(sweep_dir)
            jobs.append((candidate, seed, run_dir, [*fixed, *overrides_of(candidate.params), f"{SEED_KEY}={seed}", f"hydra.sweep.subdir={subdir}"]))
    log.info("confirming the top %d configs at seeds %s: %d runs to go", len(candidates), seeds, len(jobs))
    batch_size, first = max(1, int(settings["n_jobs"])), len(study.trials)
    for start in range(0, len(jobs), batch_size):
        batch = jobs[start : start + batch_size]
        returns = launch([overrides for *_, overrides in batch], first + start)
        for (candidate, seed, run_dir, _), job_return in zip(batch, returns):
            result = outcome(job_return, run_dir)
            if result.state == "COMPLETE":
                candidate.values[seed] = result.values[0]
            else:
                log.warning("confirmation run %s (trial %d, seed %d) did not finish: %s", run_dir, candidate.trial, seed, result.reason)
    done = Confirmation(seeds, candidates, maximize=study.directions[0].name == "MAXIMIZE")
    done.decide()
    return done
