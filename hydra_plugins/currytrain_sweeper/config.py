"""The sweeper's Hydra configs: `hydra/sweeper=currytrain` (settings come from the `sweep` node, any key set
here wins) and `hydra/sweeper=optuna`, the same sweeper under hydra-optuna-sweeper's name and defaults, so a
config written for that plugin composes unchanged. Samplers are also offered as `hydra/sweeper/sampler=<name>`."""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class CurryTrainSweeperConf:
    """hydra.sweeper: every key left null is taken from the `sweep` node (currytrain/sweep/config.py)."""

    _target_: str = "hydra_plugins.currytrain_sweeper.sweeper.CurryTrainSweeper"
    _recursive_: bool = False
    """Hydra must not build the sampler and pruner nodes: the sweeper checks and builds them (allow-list)."""
    sampler: Any = None
    """An Optuna sampler node (_target_ in optuna.samplers, seed, ...)."""
    direction: Any = None
    """minimize, maximize, or a list of them."""
    storage: Any = None
    """Optuna storage URI (null: SQLite in the sweep folder)."""
    study_name: Any = None
    """Study name in the storage."""
    n_trials: Any = None
    """Trials in the study in total."""
    n_jobs: Any = None
    """Trials in flight at once."""
    params: Any = None
    """Search space, merged over sweep.params."""
    pruner: Any = None
    """An Optuna pruner node (_target_ in optuna.pruners)."""
    objective: Any = None
    """Metric(s) each trial returns (see sweep.objective)."""
    max_failures: Any = None
    """Failed trials after which the sweep stops."""
    max_failure_rate: Any = None
    """hydra-optuna-sweeper's form of max_failures: a share of n_trials."""
    on_interrupted: Any = None
    """fail or requeue: trials a killed sweeper left running."""
    search_space: Any = None
    """Deprecated in hydra-optuna-sweeper; refused with the fix (use params)."""
    custom_search_space: Any = None
    """Not supported; refused with the fix."""


@dataclass
class OptunaCompatConf(CurryTrainSweeperConf):
    """hydra/sweeper=optuna: hydra-optuna-sweeper 1.3's defaults (TPE, minimize, 20 trials, 2 jobs)."""

    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"sampler": "tpe"}])  # the sampler option fills sampler: null
    direction: Any = "minimize"
    n_trials: Any = 20
    n_jobs: Any = 2
    max_failure_rate: Any = 0.0


SAMPLERS = {
    "tpe": "TPESampler",
    "random": "RandomSampler",
    "cmaes": "CmaEsSampler",
    "nsgaii": "NSGAIISampler",
    "qmc": "QMCSampler",
    "gp": "GPSampler",
    "grid": "GridSampler",
}

store = ConfigStore.instance()
store.store(group="hydra/sweeper", name="currytrain", node=CurryTrainSweeperConf, provider="currytrain")
store.store(group="hydra/sweeper", name="optuna", node=OptunaCompatConf, provider="currytrain")
for name, klass in SAMPLERS.items():
    store.store(group="hydra/sweeper/sampler", name=name, node={"_target_": f"optuna.samplers.{klass}", "seed": None}, provider="currytrain")
