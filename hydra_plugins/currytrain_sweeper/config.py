"""The sweeper's Hydra configs.

- `hydra/sweeper=currytrain`, always: settings come from the `sweep` node; any key set here wins.
- `hydra/sweeper=optuna` and `hydra/sweeper/sampler=<name>`, only where hydra-optuna-sweeper is not installed:
  the same sweeper under that plugin's name and defaults, so a config written for it composes unchanged. Where
  it is installed, those names stay its own and curryTrain registers nothing over them.
- `hydra/sweeper/pruner=<name>`, always (no other plugin has the group).

Sampler and pruner nodes are open: any argument of the class can be set on the command line without `+`
(`hydra.sweeper.sampler.n_startup_trials=5`); the sweeper checks each against the class's signature.
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

OFFICIAL_PACKAGE = "hydra_plugins.hydra_optuna_sweeper"
OFFICIAL_MODULE = f"{OFFICIAL_PACKAGE}.optuna_sweeper"
"""hydra-optuna-sweeper's module: its configs name `{OFFICIAL_MODULE}.OptunaSweeper`."""


ALIAS_MARKER = "_currytrain_alias.py"
"""A checkout's hydra_plugins/hydra_optuna_sweeper holds this file: that plugin's import path, handing out this
sweeper (the wheel leaves the folder out), not the plugin."""


def _plugin_folders() -> list[Path]:
    """Every hydra_optuna_sweeper folder holding a sweeper module on the hydra_plugins path."""
    namespace = sys.modules.get("hydra_plugins")
    folders = [Path(entry) / "hydra_optuna_sweeper" for entry in (namespace.__path__ if namespace is not None else [])]
    return [folder for folder in folders if (folder / "optuna_sweeper.py").is_file()]


def checkout_alias() -> bool:
    """Whether this is a checkout whose hydra_plugins/hydra_optuna_sweeper hands out this sweeper."""
    return any((folder / ALIAS_MARKER).is_file() for folder in _plugin_folders())


def official_plugin_installed() -> bool:
    """Whether Hydra finds hydra-optuna-sweeper's sweeper module (looked up on the path, not imported); a
    checkout's alias of its import path is not it."""
    module = sys.modules.get(OFFICIAL_MODULE)
    if module is not None and getattr(module, "__file__", None):
        return not (Path(module.__file__).parent / ALIAS_MARKER).is_file()
    return any(not (folder / ALIAS_MARKER).is_file() for folder in _plugin_folders())


@dataclass
class CurryTrainSweeperConf:
    """hydra.sweeper: every key left null is taken from the `sweep` node (currytrain/sweep/config.py)."""

    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"sampler": None}, {"pruner": None}])
    """hydra/sweeper/sampler=<name> and hydra/sweeper/pruner=<name> fill sampler and pruner (none chosen by default)."""
    _target_: str = "hydra_plugins.currytrain_sweeper.sweeper.CurryTrainSweeper"
    _recursive_: bool = False
    """Hydra must not build the sampler and pruner nodes: the sweeper checks and builds them (allow-list)."""
    sampler: Any = None
    """An Optuna sampler node (_target_ in optuna.samplers, seed, ...)."""
    direction: Any = None
    """minimize, maximize, or a list of them (one per objective)."""
    storage: Any = None
    """Optuna storage URI (null: SQLite in the sweep folder)."""
    study_name: Any = None
    """Study name in the storage."""
    n_trials: Any = None
    """Trials in the study in total."""
    n_jobs: Any = None
    """Trials in flight at once (a batch with Hydra's basic launcher)."""
    params: Any = None
    """Search space, merged over sweep.params; command-line entries win key by key."""
    pruner: Any = None
    """An Optuna pruner node (_target_ in optuna.pruners), or hydra/sweeper/pruner=<name>."""
    objective: Any = None
    """curryTrain runs: the metric(s) each trial returns (see sweep.objective). Plain apps: labels of the returned values."""
    max_failures: Any = None
    """Failed trials after which the sweep stops."""
    max_failure_rate: Any = None
    """hydra-optuna-sweeper's rule: the sweep stops after a batch whose failed share exceeds this (0.0 to 1.0)."""
    on_interrupted: Any = None
    """fail or requeue: trials a killed sweeper left running."""
    search_space: Any = None
    """Deprecated form of params ({type, low, high, step, log, choices} per key): converted with a warning."""
    custom_search_space: Any = None
    """Dotted path of a function (cfg, trial) that suggests more parameters on each trial."""


@dataclass
class OptunaCompatConf(CurryTrainSweeperConf):
    """hydra/sweeper=optuna: hydra-optuna-sweeper 1.3's defaults (TPE, minimize, 20 trials, 2 jobs, max_failure_rate 0)."""

    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"sampler": "tpe"}, {"pruner": None}])
    direction: Any = "minimize"
    n_trials: Any = 20
    n_jobs: Any = 2
    max_failure_rate: Any = 0.0


SAMPLERS = {
    "tpe": "TPESampler",
    "random": "RandomSampler",
    "cmaes": "CmaEsSampler",
    "nsgaii": "NSGAIISampler",
    "nsgaiii": "NSGAIIISampler",
    "qmc": "QMCSampler",
    "gp": "GPSampler",
    "grid": "GridSampler",
    "bruteforce": "BruteForceSampler",
    "motpe": "MOTPESampler",  # hydra-optuna-sweeper 1.3 offers it; Optuna 4 removed it: the sweeper says so (exit 2)
}
PRUNERS = {
    "median": {"_target_": "optuna.pruners.MedianPruner"},
    "percentile": {"_target_": "optuna.pruners.PercentilePruner", "percentile": 25.0},
    "successive_halving": {"_target_": "optuna.pruners.SuccessiveHalvingPruner"},
    "hyperband": {"_target_": "optuna.pruners.HyperbandPruner"},
    "threshold": {"_target_": "optuna.pruners.ThresholdPruner"},
    "wilcoxon": {"_target_": "optuna.pruners.WilcoxonPruner"},
    "nop": {"_target_": "optuna.pruners.NopPruner"},
}


def open_node(values: dict[str, Any]) -> DictConfig:
    """A node that accepts keys it does not hold yet (a class's arguments)."""
    node = OmegaConf.create(values)
    OmegaConf.set_struct(node, False)
    return node


def register() -> None:
    store = ConfigStore.instance()
    store.store(group="hydra/sweeper", name="currytrain", node=CurryTrainSweeperConf, provider="currytrain")
    for name, node in PRUNERS.items():
        store.store(group="hydra/sweeper/pruner", name=name, node=open_node(node), provider="currytrain")
    if official_plugin_installed():  # its names are its own
        return
    store.store(group="hydra/sweeper", name="optuna", node=OptunaCompatConf, provider="currytrain")
    for name, klass in SAMPLERS.items():
        store.store(group="hydra/sweeper/sampler", name=name, node=open_node({"_target_": f"optuna.samplers.{klass}", "seed": None}), provider="currytrain")


register()
