"""The one place that turns a config node into an object, build(cfg, **runtime), and what decides what may be built.

A config names code by `_target_`, and a config is not trusted (it may come from a shared experiment file or a
run folder): only exact registered callables are built, never whatever a module holds. Registered are the
`_target_` of every schema curryTrain and the project store (currytrain.config.register_configs), BUILT_IN_TARGETS
(Optuna's samplers and pruners, the Hydra callback, launchers and sweepers curryTrain ships or uses), the
project's `TARGETS` (experiments/__init__.py, experiments/<name>/config.py), and `build.allow` given on the
command line (build.allow=[my_package.MyLogger]: exact names, and only from the command line, which
command_line_problems checks when the config is composed).

The `hydra.*` subtree names code too, which Hydra builds itself (callbacks, launcher, sweeper, logging handlers
and factories) or hands to processes (the job's environment): hydra_problems checks it by the same rule, as the
config is composed and before Hydra builds anything from it (currytrain.config installs that check). A node Hydra
builds with `_recursive_: false` (curryTrain's sweeper) has its own target checked; what it holds is the plugin's to
build, and curryTrain's sweeper builds its sampler and pruner through build().
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from currytrain.errors import ConfigError, Outcome

log = logging.getLogger(__name__)

OPTUNA_SAMPLERS = (
    "TPESampler",
    "RandomSampler",
    "CmaEsSampler",
    "NSGAIISampler",
    "NSGAIIISampler",
    "QMCSampler",
    "GPSampler",
    "GridSampler",
    "BruteForceSampler",
)
OPTUNA_PRUNERS = (
    "MedianPruner",
    "PercentilePruner",
    "SuccessiveHalvingPruner",
    "HyperbandPruner",
    "ThresholdPruner",
    "WilcoxonPruner",
    "NopPruner",
    "PatientPruner",
)
COMPONENTS = (
    "currytrain.abort.monitor.AbortMonitor",
    "currytrain.check.ablation.Ablation",
    "currytrain.check.capacity.Capacity",
    "currytrain.check.ladder.Ladder",
    "currytrain.check.lr_range.LRRange",
    "currytrain.check.mup.MupCheck",
    "currytrain.check.preflight.Preflight",
    "currytrain.check.probe_tasks.Probe",
    "currytrain.check.resume.Resume",
    "currytrain.check.sanity.Sanity",
    "currytrain.check.scaling.Scaling",
    "currytrain.check.seeds.Seeds",
    "currytrain.check.skeleton.Skeleton",
    "currytrain.data.corpus.StdlibBytes",
    "currytrain.data.corpus.SyntheticTokens",
    "currytrain.data.corpus.TextFiles",
    "currytrain.data.probe.ProbeTasks",
    "currytrain.data.tabular.Digits",
    "currytrain.data.tabular.TableFile",
    "currytrain.data.tokens.TokenizedText",
    "currytrain.eval.runner.Evaluators",
    "currytrain.logger.aim.AimLogger",
    "currytrain.logger.jsonl.JsonlLogger",
    "currytrain.logger.mlflow.MLflowLogger",
    "currytrain.logger.tensorboard.TensorBoardLogger",
    "currytrain.logger.wandb.WandbLogger",
    "currytrain.model.gqa.GQATransformer",
    "currytrain.model.mlp.MLPClassifier",
    "currytrain.model.moe.MoETransformer",
    "currytrain.model.spiking.SpikingTransformer",
    "currytrain.optim.builders.build_adamw",
    "currytrain.optim.builders.build_sgd",
    "currytrain.parallel.strategy.Parallel",
)
"""curryTrain's own components: every _target_ its schemas name (tests/test_config.py checks the two agree), known
here so that a process that registers no schemas (a script calling the HF bridge) builds them too."""
HYDRA_CALLBACKS = ("currytrain.validate.ValidateCallback",)
HYDRA_PLUGINS = (
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
    "hydra_plugins.currytrain_sweeper.sweeper.CurryTrainSweeper",
    "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper",
    "hydra_plugins.currytrain_launcher.slurm.CurryTrainSlurmLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
)
BUILT_IN_TARGETS = frozenset(
    (
        *COMPONENTS,
        *(f"optuna.samplers.{name}" for name in OPTUNA_SAMPLERS),
        *(f"optuna.pruners.{name}" for name in OPTUNA_PRUNERS),
        *HYDRA_CALLBACKS,
        *HYDRA_PLUGINS,
    )
)
"""curryTrain's components, and what configs name besides: sweep configs a sampler and a pruner by their class
(plain search algorithms), Hydra's own config its callback, launcher and sweeper."""

_registered: set[str] = set(BUILT_IN_TARGETS)
_extra_allowed: tuple[str, ...] = ()


def dotted_name(target: Any) -> str:
    """`target` as the dotted name a config writes: a string as is, a class or function by its module and name."""
    return target if isinstance(target, str) else f"{target.__module__}.{target.__qualname__}"


def register_targets(targets: Iterable[Any]) -> None:
    """Let configs name these classes and functions (dotted names, or the objects) as `_target_`, in this process."""
    _registered.update(dotted_name(target) for target in targets)


def registered_targets() -> frozenset[str]:
    return frozenset(_registered)


def allow_targets(targets: Iterable[str]) -> None:
    """The run's `build.allow` (exact names its command line allowed), for every later build() in this process
    (build_components sets them for the run it builds; they replace those of an earlier run in the same process)."""
    global _extra_allowed
    _extra_allowed = tuple(str(target) for target in targets)


REGISTER_FIX = (
    "name a registered component, register the class (its schema's _target_, or TARGETS in experiments/__init__.py), "
    "or pass build.allow=[<its dotted name>] on the command line"
)


def target_problem(target: Any, extra: Iterable[str] = ()) -> str | None:
    """Why `target` may not be built (not a registered callable, or not importable), or None if it may. Nothing
    is imported for a target that is not registered."""
    if not isinstance(target, str) or (target not in _registered and target not in {str(entry) for entry in extra}):
        return f"{target} is not a registered component: {REGISTER_FIX}"
    from hydra.utils import get_object  # Hydra's own resolver, the one instantiate() uses

    try:
        found = get_object(target)
    except Exception as error:  # any import failure is the user's to fix
        reason = " ".join(str(error.__cause__ or error).split())
        return f"{target} cannot be imported ({reason}): check the spelling, or that the module imports"
    if not callable(found) or isinstance(found, ModuleType):
        return f"{target} resolves to {found!r}, which is not a class or function: name the class or function itself"
    return None


def targets(node: Any, path: str = "") -> Iterable[tuple[str, Any]]:
    """Every (key, _target_) in the subtree: instantiate builds targets inside lists too."""
    if isinstance(node, DictConfig):
        target = node._get_node("_target_")._value() if "_target_" in node else None  # unresolved: an interpolation is refused
        if target is not None:
            yield (f"{path}._target_" if path else "_target_"), target
        for key in node.keys():
            yield from targets(node._get_node(key), f"{path}.{key}" if path else str(key))
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            yield from targets(node._get_node(index), f"{path}[{index}]")
    elif isinstance(node, Mapping):
        if node.get("_target_") is not None:
            yield (f"{path}._target_" if path else "_target_"), node["_target_"]
        for key, value in node.items():
            yield from targets(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            yield from targets(value, f"{path}[{index}]")


def target_problems(node: Any, path: str = "", extra: Iterable[str] = ()) -> list[str]:
    return [f"{key}={problem}" for key, target in targets(node, path) if (problem := target_problem(target, extra))]


def build(cfg: DictConfig, *, exclude: Iterable[str] = (), **runtime: Any) -> Any:
    """Instantiate `cfg._target_` with the config fields plus runtime-only arguments.

    exclude: config fields that are not constructor arguments (applied by someone else).
    Returns None for a node without a target (the `none` option of a group).
    """
    if cfg.get("_target_") is None:
        return None
    problems = target_problems(cfg, extra=_extra_allowed)
    if problems:
        raise ConfigError("; ".join(problems))
    collisions = sorted(set(runtime) & set(cfg.keys()))
    if collisions:
        raise ConfigError(f"build({cfg._target_}): runtime arguments {collisions} collide with config fields of the same name")
    node = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k not in set(exclude)]) if exclude else cfg
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate  # deferred: keeps `import currytrain.build` cheap

    log.debug("build %s", cfg._target_)
    try:
        with _hydra_whitelist(_extra_allowed):
            return instantiate(node, _convert_="all", **runtime)
    except InstantiationException as error:
        # A component's own outcome (a ConfigError is the user's message; a stop signal) passes on unwrapped.
        if isinstance(error.__cause__, Outcome):
            raise error.__cause__ from None
        raise


def _hydra_whitelist(extra: Iterable[str]) -> Any:
    """Hydra 1.4's execution whitelist, where that Hydra is installed, holding the same exact names (a second
    guard, in Hydra itself); a no-op context under Hydra 1.3."""
    import contextlib

    import hydra.utils

    whitelist = getattr(hydra.utils, "execution_whitelist", None)
    return whitelist(*sorted(_registered | set(extra))) if whitelist is not None else contextlib.nullcontext()


def hydra_main_whitelist() -> dict[str, Any]:
    """@hydra.main's keyword for Hydra 1.4's execution whitelist (the registered targets), or none under 1.3."""
    import inspect

    import hydra

    if "execution_whitelist" not in inspect.signature(hydra.main).parameters:
        return {}
    return {"execution_whitelist": tuple(sorted(_registered))}


# ------------------------------------------------------------------------------------- the hydra.* subtree

LOGGING_CLASSES = frozenset(
    (
        "logging.StreamHandler",
        "logging.FileHandler",
        "logging.NullHandler",
        "logging.handlers.RotatingFileHandler",
        "logging.handlers.TimedRotatingFileHandler",
        "logging.handlers.WatchedFileHandler",
        "logging.Formatter",
        "logging.Filter",
        "colorlog.ColoredFormatter",
    )
)
"""The handler, formatter and filter classes a logging config may name (`class:` or `():`), besides registered ones."""
LOGGING_STREAMS = frozenset(("ext://sys.stdout", "ext://sys.stderr"))
RUN_FOLDER = re.compile(r"^\$\{hydra[.:]runtime\.output_dir\}/")
"""A log file's path must start here (in the job's run folder), as Hydra's own job_logging's does."""

ENV_NAMES = frozenset(
    (
        "CUDA_VISIBLE_DEVICES",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "PYTORCH_CUDA_ALLOC_CONF",
        "TORCH_DISTRIBUTED_DEBUG",
        "TORCH_CPP_LOG_LEVEL",
        "TORCH_SHOW_CPP_STACKTRACES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TOKENIZERS_PARALLELISM",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "CURRYTRAIN_SWEEP",
        "CURRYTRAIN_TRIAL",
    )
)
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GLOO_", "WANDB_", "MLFLOW_")
"""What a config file may put into a job's environment (hydra.job.env_set). Others can choose which code a program
loads (LD_PRELOAD, PYTHONPATH, PATH, GIT_*, compiler caches, plotting backends): only the command line (or the
shell) may set those."""


def _raw(node: Any) -> Any:
    """A config subtree as plain containers, interpolations left unresolved (Hydra's runtime keys are not set yet)."""
    if isinstance(node, DictConfig | ListConfig):
        return OmegaConf.to_container(node, resolve=False)
    return node


def _override_keys(overrides: Iterable[str]) -> dict[str, str]:
    """{key: value text} of the command line's overrides (`+`, `++` and `~` stripped from the key)."""
    keys = {}
    for override in overrides:
        key, equals, value = str(override).partition("=")
        if equals:
            keys[key.lstrip("+~")] = value
    return keys


def hydra_problems(cfg: DictConfig, overrides: Iterable[str] = ()) -> list[str]:
    """Every problem of the composed config's `hydra.*` subtree and of what only the command line may say, each
    with its key and fix. `overrides`: the command line's (the trusted source of build.allow and env_set)."""
    hydra = cfg._get_node("hydra") if "hydra" in cfg else None
    from_command_line = _override_keys(overrides)
    problems = command_line_problems(cfg, from_command_line)
    if not isinstance(hydra, DictConfig):
        return problems
    raw = _raw(hydra)
    nodes = [(f"callbacks.{name}", node) for name, node in (raw.get("callbacks") or {}).items()] if isinstance(raw.get("callbacks"), Mapping) else []
    for path, node in [*nodes, ("launcher", raw.get("launcher")), ("sweeper", raw.get("sweeper"))]:
        built = (
            targets(node, path) if not (isinstance(node, Mapping) and node.get("_recursive_") is False) else targets({"_target_": node.get("_target_")}, path)
        )
        problems += [f"hydra.{key}={problem}" for key, target in built if (problem := target_problem(target))]
    problems += _callback_problems(raw.get("callbacks"), _is_curry_train(cfg))
    for part in ("job_logging", "hydra_logging"):
        problems += _logging_problems(raw.get(part), f"hydra.{part}")
    problems += _env_problems((raw.get("job") or {}).get("env_set"), from_command_line)
    problems += _sweep_params_problems(raw, cfg)
    return problems


def _is_curry_train(cfg: DictConfig) -> bool:
    """A config of a curryTrain app (the root schema's build node), not of a plain Hydra app in the same process."""
    return isinstance(cfg._get_node("build") if "build" in cfg else None, DictConfig) and "allow" in cfg.build


def _callback_problems(callbacks: Any, curry_train: bool) -> list[str]:
    problems = []
    if callbacks is not None and not isinstance(callbacks, Mapping):
        return [f"hydra.callbacks must be a mapping of name -> node with a _target_: remove hydra.callbacks={callbacks}"]
    for name, node in (callbacks or {}).items():
        if not isinstance(node, Mapping) or "_target_" not in node:
            problems.append(f"hydra.callbacks.{name}={node} is not a node with a _target_ (a registered Hydra callback): remove it")
    validate = (callbacks or {}).get("validate")
    if curry_train and not (isinstance(validate, Mapping) and validate.get("_target_") == HYDRA_CALLBACKS[0] and len(validate) == 1):
        problems.append(f"hydra.callbacks.validate must stay {{_target_: {HYDRA_CALLBACKS[0]}}} (curryTrain's validation): remove what changes it")
    return problems


def _logging_problems(node: Any, path: str) -> list[str]:
    """A logging.config dictConfig may name classes (`class`), factories (`()`, `queue`, `listener`), objects
    (`ext://`) and files (`filename`): each must be one of LOGGING_CLASSES or registered, a standard stream, or a
    file in the run folder."""
    problems: list[str] = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            where = f"{path}.{key}"
            if key in ("class", "()", "queue", "listener") and not isinstance(value, Mapping):
                if value not in LOGGING_CLASSES and value not in _registered:
                    problems.append(
                        f"{where}={value} is not a logging class curryTrain allows ({sorted(LOGGING_CLASSES)}) nor a registered component: "
                        "use one of them, or register yours (TARGETS in experiments/__init__.py)"
                    )
            elif key == "filename" and not (isinstance(value, str) and RUN_FOLDER.match(value) and ".." not in value):
                problems.append(f"{where}={value}: a log file must be inside the run folder: pass {where}='${{hydra.runtime.output_dir}}/<name>.log'")
            else:
                problems += _logging_problems(value, where)
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            problems += _logging_problems(value, f"{path}[{index}]")
    elif isinstance(node, str) and node.startswith("ext://") and node not in LOGGING_STREAMS:
        problems.append(f"{path}={node}: a logging config may refer only to {sorted(LOGGING_STREAMS)}: remove it")
    return problems


def _env_problems(env_set: Any, from_command_line: Mapping[str, str]) -> list[str]:
    if not isinstance(env_set, Mapping):
        return [] if env_set is None else [f"hydra.job.env_set={env_set} must be a mapping of variable -> value"]
    problems = []
    for name in env_set:
        allowed = name in ENV_NAMES or str(name).startswith(ENV_PREFIXES) or f"hydra.job.env_set.{name}" in from_command_line
        if not allowed:
            problems.append(
                f"hydra.job.env_set.{name}: a config file may not set {name}, which can choose the code a program loads "
                f"(allowed: {sorted(ENV_NAMES)} and {list(ENV_PREFIXES)}*): set it in your shell, or pass hydra.job.env_set.{name}=... on the command line"
            )
    return problems


def _touches_trust(key: Any) -> bool:
    name = str(key).lstrip("+~")
    return name.split(".")[0].split("/")[0] in ("hydra", "build")


def _sweep_params_problems(raw_hydra: Mapping[str, Any], cfg: DictConfig) -> list[str]:
    """A sweep's params become each job's overrides: they may not set hydra.* or build.* (the command line's to say)."""
    swept = [("hydra.sweeper.params", (raw_hydra.get("sweeper") or {}).get("params"))]
    if isinstance(cfg._get_node("sweep") if "sweep" in cfg else None, DictConfig):
        swept.append(("sweep.params", _raw(cfg.sweep._get_node("params")) if "params" in cfg.sweep else None))
    return [
        f"{where}.{key}: a sweep may not search or fix {str(key).lstrip('+~')} (what Hydra runs and what may be built are the command line's to say): "
        f"remove it, or pass it on the command line"
        for where, params in swept
        if isinstance(params, Mapping)
        for key in params
        if _touches_trust(key)
    ]


def command_line_problems(cfg: DictConfig, from_command_line: Mapping[str, str]) -> list[str]:
    """build.allow widens what may run: only the command line may set it, and only to exact names."""
    if not _is_curry_train(cfg):
        return []
    allow = _raw(cfg.build._get_node("allow"))
    if not allow:
        return []
    if "build.allow" not in from_command_line:
        return [
            f"build.allow={allow} is set by a config file: only the command line may widen what may be built "
            "(pass build.allow=[...] yourself), or register the classes in the project's code (TARGETS in experiments/__init__.py)"
        ]
    entries = allow if isinstance(allow, list) else [allow]
    return [
        f"build.allow entry {entry} is not the dotted name of a class or function: name each one (build.allow=[my_package.MyLogger]), not a module"
        for entry in entries
        if not isinstance(entry, str) or "." not in entry or _is_module(entry)
    ]


def _is_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
