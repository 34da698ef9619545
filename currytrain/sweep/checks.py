"""Checks of a sweep's settings, shared by validation (the `sweep` node) and the sweeper plugin (the settings
merged with `hydra.sweeper`), so a bad sweep exits 2 before any trial starts and before anything is written.

Samplers and pruners are resolved here by name inside optuna.samplers / optuna.pruners only: those two
modules are on build()'s allow-list on purpose (pure search algorithms, nothing else of optuna).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any

from currytrain.sweep.space import parse_params

DIRECTIONS = ("minimize", "maximize")
OBJECTIVES = ("val/loss", "val/bits_per_token", "train/loss", "run/seconds", "model/num_params")
PRUNABLE = ("val/loss", "val/bits_per_token", "train/loss")
"""Objectives with a value at each eval step, which a pruner can compare across trials."""
ON_INTERRUPTED = ("fail", "requeue")
RUNTIME_ARGS = {"optuna.samplers.GridSampler": {"search_space"}}
"""Arguments the sweeper passes itself (GridSampler's grid comes from `params`)."""
IGNORED_ARGS = {"_partial_"}
"""Keys a sampler node may carry for Hydra's instantiate (hydra-optuna-sweeper's grid node has _partial_: true)."""
REMOVED = {
    "MOTPESampler": "is not in Optuna 4 and later (it was deprecated when TPESampler learnt several objectives): use "
    "optuna.samplers.TPESampler (hydra/sweeper/sampler=tpe) or optuna.samplers.NSGAIISampler (hydra/sweeper/sampler=nsgaii)",
    "BoTorchSampler": "lives in the optuna-integration package, outside Optuna and outside what this sweeper builds: use "
    "optuna.samplers.GPSampler (hydra/sweeper/sampler=gp), Optuna's own Gaussian-process sampler",
}
"""Classes that configs written for older Optuna releases name, and why they are not there now."""


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig" else [value]


def _named(module: str, target: Any, where: str) -> tuple[type | None, str | None]:
    """The class `target` names inside optuna's `module`, or the problem."""
    import importlib

    package = importlib.import_module(module)
    names = sorted(n for n in getattr(package, "__all__", dir(package)) if inspect.isclass(getattr(package, n, None)))
    name = str(target).rpartition(".")[2]
    klass = getattr(package, name, None) if str(target) in (f"{module}.{name}", name) else None
    if inspect.isclass(klass):
        return klass, None
    if name in REMOVED:
        return None, f"{where}._target_={target}: {name} {REMOVED[name]}"
    near = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {module}.{near[0]}? " if near else ""
    return None, f"{where}._target_={target} is not a class of {module}: {hint}choose one of {[f'{module}.{n}' for n in names]}"


def _component_problems(node: Any, where: str, module: str) -> list[str]:
    if not isinstance(node, Mapping) and type(node).__name__ != "DictConfig":
        return [f"{where}={node} must be a mapping with a _target_ (a class of {module}): e.g. {where}._target_={module}.<Name>"]
    klass, problem = _named(module, node.get("_target_"), where)
    if klass is None:
        return [problem]
    parameters = inspect.signature(klass).parameters
    given = set(map(str, node.keys())) - {"_target_"} - IGNORED_ARGS - RUNTIME_ARGS.get(f"{module}.{klass.__name__}", set())
    unknown = sorted(given - set(parameters))
    return [
        f"{where}.{key} is not an argument of {klass.__name__}: remove it; valid arguments: {sorted(p for p in parameters if p not in ('self', 'kwargs'))}"
        for key in unknown
    ]


def _direction_problems(direction: Any, where: str) -> list[str]:
    bad = [d for d in as_list(direction) if d not in DIRECTIONS]
    return [f"{where}={direction}: each direction is one of {list(DIRECTIONS)}: pass {where}=minimize"] if bad else []


def _objective_problems(settings: Any, paths: Mapping[str, str], plain_task: bool) -> list[str]:
    """A curryTrain run reads its objectives from the run's journal, by name; a plain Hydra app returns them,
    and `objective` then only labels them (one label per direction)."""
    objectives, directions = as_list(settings.get("objective", "val/loss")), as_list(settings.get("direction", "minimize"))
    where = paths.get("objective", "sweep.objective")
    if plain_task and not where.startswith("hydra.sweeper"):  # not given: one label per direction
        return []
    unknown = [] if plain_task else [name for name in objectives if name not in OBJECTIVES]
    problems = [f"{where}={name} is not a metric a trial reports: choose one of {list(OBJECTIVES)}" for name in unknown]
    if len(objectives) != len(directions):
        problems.append(
            f"{where} names {len(objectives)} metric(s) but {paths.get('direction', 'sweep.direction')} has {len(directions)}: "
            f"pass one objective per direction, e.g. {where}=[val/loss,model/num_params]"
        )
    return problems


def no_pruner(pruner: Any) -> bool:
    """null, `none` and an empty mapping (the sweep node's default, open to pruner arguments) mean no pruning."""
    return pruner is None or pruner == "none" or ((isinstance(pruner, Mapping) or type(pruner).__name__ == "DictConfig") and not pruner)


def _pruner_problems(settings: Any, paths: Mapping[str, str], plain_task: bool) -> list[str]:
    pruner = settings.get("pruner")
    where = paths.get("pruner", "sweep.pruner")
    if no_pruner(pruner):
        return []
    problems = _component_problems(pruner, where, "optuna.pruners")
    if len(as_list(settings.get("direction", "minimize"))) > 1:
        problems.append(f"{where}: Optuna cannot prune a multi-objective study: pass {where}=null or a single direction")
    objectives = [] if plain_task else as_list(settings.get("objective", "val/loss"))
    unprunable = [name for name in objectives if name in OBJECTIVES and name not in PRUNABLE]
    if unprunable:
        problems.append(f"{where}: the objective {unprunable[0]} has no value before the run ends: pass {where}=null, or objective in {list(PRUNABLE)}")
    return problems


def _count_problems(settings: Any, paths: Mapping[str, str]) -> list[str]:
    problems = []
    for key, minimum in (("n_trials", 1), ("n_jobs", 1), ("max_failures", 1)):
        value = settings.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
            problems.append(f"{paths.get(key, 'sweep.' + key)}={value} must be an integer >= {minimum}")
    for key, minimum in (("confirm_top_k", 0), ("confirm_seeds", 2)):
        value = settings.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
            problems.append(f"{paths.get(key, 'sweep.' + key)}={value} must be an integer >= {minimum}")
    rate = settings.get("max_failure_rate")
    if rate is not None and not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0.0 <= rate <= 1.0):
        where = paths.get("max_failure_rate", "hydra.sweeper.max_failure_rate")
        problems.append(f"{where}={rate} must be a share between 0.0 and 1.0: the failed share of a batch above which the sweep stops, e.g. {where}=0.5")
    mode = settings.get("on_interrupted", "fail")
    if mode not in ON_INTERRUPTED:
        problems.append(f"{paths.get('on_interrupted', 'sweep.on_interrupted')}={mode} is not one of {list(ON_INTERRUPTED)}: pass fail")
    storage = settings.get("storage")
    if storage is not None and "://" not in str(storage):
        where = paths.get("storage", "sweep.storage")
        problems.append(f"{where}={storage} is not a storage URI: pass null (SQLite in the sweep folder), sqlite:///path.db or journal:///path.log")
    return problems


def sweep_problems(settings: Any, paths: Mapping[str, str], plain_task: bool = False) -> list[str]:
    """Every problem of the settings (a mapping of OptunaSweepConfig keys); `paths` names each key's origin.
    `plain_task`: the jobs are a plain Hydra app's, which return their objective values."""
    params = settings.get("params") or {}
    _, problems = parse_params(params, paths.get("params", "sweep.params"))
    problems += _component_problems(settings.get("sampler"), paths.get("sampler", "sweep.sampler"), "optuna.samplers")
    problems += _pruner_problems(settings, paths, plain_task)
    problems += _direction_problems(settings.get("direction", "minimize"), paths.get("direction", "sweep.direction"))
    problems += _objective_problems(settings, paths, plain_task)
    return problems + _count_problems(settings, paths) + _confirm_problems(settings, paths, plain_task)


def _confirm_problems(settings: Any, paths: Mapping[str, str], plain_task: bool) -> list[str]:
    """confirm_top_k reruns configs at other seeds: one objective, and a run that has a seed (curryTrain's)."""
    if not settings.get("confirm_top_k"):
        return []
    where = paths.get("confirm_top_k", "sweep.confirm_top_k")
    if len(as_list(settings.get("direction", "minimize"))) > 1:
        return [f"{where}: a multi-objective study has a Pareto front, not one winner to confirm: pass {where}=0 or a single direction"]
    if plain_task:
        return [f"{where}: confirming reruns a config at other seeds, which needs a curryTrain run (its `seed` key): pass {where}=0"]
    return []
