"""The root config schema and its registration in Hydra's ConfigStore.

Every group option in conf/ is a YAML file whose defaults list names one schema stored here
(`/schema/<group>/<option>`), so a mistyped key fails at composition with Hydra's own message.
A project's own experiments register theirs the same way: experiments/<name>/config.py holds a SCHEMAS
dict shaped like the one below, and register_configs() stores it beside the built-in schemas.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from currytrain.abort.config import AbortConfig, NoAbortConfig
from currytrain.build import hydra_problems, register_targets, targets
from currytrain.check.config import (
    AblationCheckConfig,
    CapacityCheckConfig,
    FullLadderConfig,
    LRRangeCheckConfig,
    MupCheckCheckConfig,
    NoCheckConfig,
    PreflightCheckConfig,
    ProbeCheckConfig,
    ResumeCheckConfig,
    SanityCheckConfig,
    ScalingCheckConfig,
    SeedsCheckConfig,
    SkeletonCheckConfig,
)
from currytrain.conf import CONF_DIR, app_config, enter_app  # noqa: F401 (CONF_DIR: launch.py and tests ask here)
from currytrain.cost.config import CostConfig
from currytrain.data.config import DigitsConfig, ProbeConfig, StdlibBytesConfig, SyntheticConfig, TableConfig, TextConfig, TokensConfig
from currytrain.eval.config import EvalConfig, NoEvalConfig
from currytrain.logger.config import AimConfig, JsonlConfig, MLflowConfig, TensorBoardConfig, WandbConfig
from currytrain.model.config import GQAConfig, MLPConfig, MoEConfig, SpikingConfig
from currytrain.optim.config import AdamWConfig, SGDConfig
from currytrain.parallel.config import ParallelConfig
from currytrain.rules import bounded
from currytrain.sweep.config import SWEEP_PRESETS, NoSweepConfig, OptunaSweepConfig
from currytrain.trainer.config import TrainerConfig

# group -> option name -> schema. The YAML option <group>/<name>.yaml extends /schema/<group>/<name>.
SCHEMAS: dict[str, dict[str, type]] = {
    "model": {"gqa": GQAConfig, "moe": MoEConfig, "spiking": SpikingConfig, "mlp": MLPConfig},
    "data": {
        "bytes": StdlibBytesConfig,
        "text": TextConfig,
        "synthetic": SyntheticConfig,
        "tokens": TokensConfig,
        "probe": ProbeConfig,
        "digits": DigitsConfig,
        "table": TableConfig,
    },
    "parallel": {name: ParallelConfig for name in ("single", "ddp", "zero1", "zero2", "fsdp", "hsdp", "tp", "ep", "cp", "pp", "hybrid")},
    "optimizer": {"adamw": AdamWConfig, "sgd": SGDConfig},
    "logger": {"tensorboard": TensorBoardConfig, "jsonl": JsonlConfig, "mlflow": MLflowConfig, "wandb": WandbConfig, "aim": AimConfig},
    "check": {
        "none": NoCheckConfig,
        "skeleton": SkeletonCheckConfig,
        "preflight": PreflightCheckConfig,
        "sanity": SanityCheckConfig,
        "resume": ResumeCheckConfig,
        "lr_range": LRRangeCheckConfig,
        "mup": MupCheckCheckConfig,
        "seeds": SeedsCheckConfig,
        "ablation": AblationCheckConfig,
        "capacity": CapacityCheckConfig,
        "probe": ProbeCheckConfig,
        "scaling": ScalingCheckConfig,
        "ladder": FullLadderConfig,
    },
    "sweep": {"none": NoSweepConfig, **{name: OptunaSweepConfig for name in SWEEP_PRESETS}},
    "abort": {"none": NoAbortConfig, "default": AbortConfig, "strict": AbortConfig},
    "cost": {"h100": CostConfig, "a100": CostConfig, "cpu": CostConfig},
    "eval": {"none": NoEvalConfig, "synthetic": EvalConfig, "local": EvalConfig},
}


@dataclass
class BuildConfig:
    """What build() may instantiate besides the registered components (currytrain.build)."""

    allow: list[str] = field(default_factory=list)
    """Exact dotted names of more classes and functions configs may name as _target_ (build.allow=[my_package.MyLogger]).
    Only the command line may set it: a config file that does is refused, as is a module name."""


@dataclass
class RootConfig:
    model: Any = MISSING
    data: Any = MISSING
    parallel: Any = MISSING
    optimizer: Any = MISSING
    logger: dict[str, Any] = field(default_factory=dict)
    check: Any = MISSING
    sweep: Any = MISSING
    abort: Any = MISSING
    cost: Any = MISSING
    eval: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    build: BuildConfig = field(default_factory=BuildConfig)
    seed: int = bounded(0, ge=0, lt=2**63)
    """Seeds model init, the data split and every batch: same seed, same loss curve."""


def store_schemas(schemas: dict[str, dict[str, type]]) -> None:
    cs = ConfigStore.instance()
    for group, options in schemas.items():
        for name, schema in options.items():
            # Stored outside the option's own group so `Available options in 'model'` lists only real options.
            cs.store(group=f"schema/{group}", name=name, node=schema)


def schema_targets(schema: type) -> list[str]:
    """Every `_target_` a schema names by default, nested nodes included (a ladder's stages); none for a `???`."""
    from omegaconf import OmegaConf

    node = OmegaConf.structured(schema)
    return [target for _, target in targets(node) if isinstance(target, str) and target not in ("", "???")]


def experiment_config_modules() -> list[str]:
    """The experiments/<name>/config.py modules of the project on sys.path (the folder of its launch.py)."""
    spec = importlib.util.find_spec("experiments")
    if spec is None or not spec.submodule_search_locations:
        return []
    packages = sorted(info.name for info in pkgutil.iter_modules(spec.submodule_search_locations) if info.ispkg)
    return [f"experiments.{name}.config" for name in packages if importlib.util.find_spec(f"experiments.{name}.config")]


def register_configs() -> None:
    """Store the root schema, every built-in option's schema and those of the project's experiments; register the
    targets the project's schemas name and its TARGETS (experiments/__init__.py, experiments/<name>/config.py), so
    configs may name them (currytrain.build); check every composition."""
    ConfigStore.instance().store(name="root_schema", node=RootConfig)
    store_schemas(SCHEMAS)
    if importlib.util.find_spec("experiments") is not None:
        register_targets(getattr(importlib.import_module("experiments"), "TARGETS", ()))
    for module in experiment_config_modules():  # curryTrain's own targets are build.COMPONENTS already
        config = importlib.import_module(module)
        store_schemas(config.SCHEMAS)
        register_targets(target for options in config.SCHEMAS.values() for schema in options.values() for target in schema_targets(schema))
        register_targets(getattr(config, "TARGETS", ()))
    check_compositions()


def check_compositions() -> None:
    """Check every config Hydra composes in this process (an app's, a sweep's jobs', the compose API's) before it is
    returned, so before Hydra builds anything from its hydra.* subtree: Hydra 1.3 configures logging from the
    composed config and instantiates its callbacks right after composing, with no hook in between, so the check
    wraps the composition itself (currytrain.build.hydra_problems says what it checks). Idempotent."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    if getattr(ConfigLoaderImpl.load_configuration, "checked_by_currytrain", False):
        return
    compose = ConfigLoaderImpl.load_configuration

    @functools.wraps(compose)
    def load_configuration(self: Any, config_name: str | None, overrides: list[str], *args: Any, **kwargs: Any) -> DictConfig:
        from currytrain.errors import ConfigError, format_problems

        cfg = compose(self, config_name, overrides, *args, **kwargs)
        if problems := hydra_problems(cfg, overrides):
            raise ConfigError(format_problems(problems))
        return cfg

    load_configuration.checked_by_currytrain = True  # type: ignore[attr-defined]
    ConfigLoaderImpl.load_configuration = load_configuration


def compose_config(overrides: list[str]) -> DictConfig:
    """The config `python launch.py OVERRIDES` runs, composed outside a running Hydra app (the `currytrain`
    command, bench/): in a project (or any folder under it), the project's root config with its experiments,
    as its launch.py composes it (currytrain.conf.enter_app); elsewhere curryTrain's own. An unknown option or
    key raises ConfigError with Hydra's message (it lists the options): exit code 2 in the CLI."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from currytrain.compose_errors import composition_problem
    from currytrain.errors import ConfigError, format_problems
    from currytrain.validate import take_vocab_from_tokenizer

    config_dir, config_name = app_config(enter_app())
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        try:
            cfg = compose(config_name=config_name, overrides=overrides)
        except HydraException as error:
            raise ConfigError(format_problems([composition_problem(error) or str(error).split("\nConfig search path:")[0]])) from None
    take_vocab_from_tokenizer(cfg)  # as launch.py's validation does before the run
    return cfg


def unparsable_overrides(args: list[str]) -> list[str]:
    """Overrides Hydra's grammar cannot read, each named (Hydra's own message names only the input it stopped at),
    and arguments that are not UTF-8 (a path quoted from a file system of another encoding): every file a run
    writes names its folder in UTF-8."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser, problems = OverridesParser.create(), []
    for arg in args:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            problems.append(f"{shown}: the argument is not UTF-8 text (\ufffd marks the bytes that are not): pass the value in UTF-8, e.g. rename the folder")
            continue
        if arg.startswith("-") or "=" not in arg and not arg.startswith("~"):
            continue
        try:
            parser.parse_override(arg)
        except HydraException as error:
            key = arg.split("=", 1)[0]
            reason = str(error).split("\n")[0]
            problems.append(
                f"{arg}: the value of {key.lstrip('+~')} is not valid override syntax ({reason}): quote it, e.g. {key}='<value>', "
                "or see https://hydra.cc/docs/advanced/override_grammar/basic"
            )
    return problems


def unknown_list_choices(args: list[str], conf_dirs: list[Path]) -> list[str]:
    """Hydra lists the options of a group when one chosen option does not exist (`model=nope`), but not
    for a list of options (`logger=[tensorboard,nope]`): the problems of such overrides, with the options."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        overrides = OverridesParser.create().parse_overrides([arg for arg in args if "=" in arg and not arg.startswith("-")])
    except HydraException:
        return []  # Hydra reports malformed overrides itself
    problems = []
    for override in overrides:
        groups = [conf_dir / override.key_or_group for conf_dir in conf_dirs if (conf_dir / override.key_or_group).is_dir()]
        value = override.value()
        if not groups or not isinstance(value, list):
            continue
        options = sorted({path.stem for group in groups for path in group.glob("*.yaml")})
        for name in value:
            if name not in options:
                problems.append(
                    f"{override.key_or_group}={override.input_line.split('=', 1)[1]}: {override.key_or_group} has no option '{name}': choose from {options}"
                )
    return problems


def broken_yaml_choices(args: list[str], conf_dirs: list[Path]) -> list[str]:
    """The chosen options (`experiment=my_idea`, `logger=[a,b]`) whose YAML file does not parse: Hydra would
    print the YAML parser's whole traceback; this names the file, the line and the problem."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        overrides = OverridesParser.create().parse_overrides([arg for arg in args if "=" in arg and not arg.startswith("-")])
    except HydraException:
        return []
    searched = [*conf_dirs]
    for override in overrides:
        if override.key_or_group == "hydra.searchpath" and isinstance(override.value(), list):
            searched += [Path(str(entry).removeprefix("file://")) for entry in override.value() if not str(entry).startswith("pkg://")]
    problems = []
    for override in overrides:
        value = override.value()
        for name in value if isinstance(value, list) else [value]:
            for conf_dir in searched:
                path = conf_dir / override.key_or_group / f"{name}.yaml"
                if not isinstance(name, str) or not path.is_file():
                    continue
                try:
                    yaml.safe_load(path.read_text())
                except yaml.YAMLError as error:
                    mark = getattr(error, "problem_mark", None)
                    where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
                    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
                    problems.append(f"{override.key_or_group}={name}: {path} is not valid YAML ({where.strip()}: {problem}): fix that file")
    return problems
