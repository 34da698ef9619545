"""Typed configs of the sweep group (conf/sweep/): `none` (a single run) and the Optuna presets.

The presets (tpe, cmaes, gp, qmc, random, grid, asha, hyperband, seeds) all fill OptunaSweepConfig; the
sweeper plugin (hydra_plugins/currytrain_sweeper) reads this node, merged with any keys written the
hydra-optuna-sweeper way under `hydra.sweeper`. Nothing is built from it inside a job except the pruner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from currytrain.sweep.checks import sweep_problems

SWEEP_PRESETS = ("tpe", "random", "cmaes", "gp", "qmc", "grid", "asha", "hyperband", "seeds")
"""conf/sweep/<name>.yaml files that fill OptunaSweepConfig (sampler, pruner, a default search space)."""


def open_node(values: dict[str, Any]) -> DictConfig:
    """A node that takes keys it does not hold yet: a sampler's or pruner's arguments are the class's, so
    `sweep.sampler.n_startup_trials=5` works without `+` (the sweeper checks each one against the class)."""
    node = OmegaConf.create(values)
    OmegaConf.set_struct(node, False)
    return node


@dataclass
class NoSweepConfig:
    """sweep=none: a single run, no Optuna study."""

    _target_: str | None = None


@dataclass
class OptunaSweepConfig:
    """An Optuna study run through Hydra's multirun (`python launch.py -m sweep=tpe`)."""

    _target_: str | None = None
    """Unused: the Hydra sweeper plugin reads this node (hydra/sweeper=currytrain, set by every preset)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Search space, one override per key, as hydra-optuna-sweeper writes it: `interval(a, b)`,
    `int(interval(a, b))`, `tag(log, interval(a, b))`, `choice(x, y, ...)`, `range(start, stop[, step])`
    (stop excluded, as in Python); a plain value is a fixed override passed to every trial."""
    sampler: Any = field(default_factory=lambda: open_node({"_target_": "optuna.samplers.TPESampler", "seed": 0}))
    """The Optuna sampler: `_target_` (a class of optuna.samplers) and its arguments; `seed` makes the sweep
    reproducible (a resumed sweep reseeds with seed + trials done, so it does not replay its start-up points)."""
    pruner: Any = field(default_factory=lambda: open_node({}))
    """No pruning when empty or null; else an Optuna pruner: `_target_` (a class of optuna.pruners) and its arguments."""
    direction: Any = "minimize"
    """minimize or maximize, or a list of them (one per objective) for a multi-objective study."""
    objective: Any = "val/loss"
    """What each trial returns to the study, one metric (or a list, one per direction): val/loss (final),
    val/bits_per_token, train/loss (last logged), run/seconds (training time), model/num_params."""
    n_trials: int = 20
    """Trials in the study in total: a rerun of the same command resumes and stops there."""
    n_jobs: int = 1
    """Trials in flight at once (a batch with Hydra's basic launcher; kept busy with submitit launchers)."""
    storage: str | None = None
    """Optuna storage URI; null: SQLite in the sweep folder (optuna.db). `journal:///path/file.log` selects
    Optuna's JournalFileBackend (many concurrent workers); any RDB URL works (postgresql://...)."""
    study_name: str | None = None
    """The study's name in the storage; null: `currytrain`. The same name in the same storage resumes."""
    max_failures: int = 3
    """Failed trials (crash, non-finite objective, config error of a swept value) after which the sweep stops."""
    confirm_top_k: int = 0
    """Off when 0. Else, once n_trials are done, the k best distinct configs run again at confirm_seeds fresh seeds
    each (not trials of the study: folders under <sweep dir>/confirm/), and the report names a winner only where
    it beats every other one on those seeds (paired by seed, Holm-corrected; currytrain.stats)."""
    confirm_seeds: int = 3
    """Seeds per config for confirm_top_k: the same seeds for every config, none of them a trial's (seed + 1, ...)."""
    on_interrupted: str = "fail"
    """Trials a killed sweeper left RUNNING with no result in their run folder: fail (recorded FAIL) or
    requeue (recorded FAIL, not counted, and their parameters asked again)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        return sweep_problems(node, {key: f"{path}.{key}" for key in node.keys()})
