"""Short training runs that a stage starts in-process (seeds, ablation arms, model sizes).

Each sub-run is a real run folder below the ladder's: `<run>/<stage>/<name>/` with resolved.yaml, a journal
(header, metrics, finish) and jsonl metrics, so `currytrain compare <run>/<stage>` reads them like any
runs. It trains with the Trainer inside the parallel session the ladder already holds, and the ladder's own
journal gets one `subrun` event per sub-run. Checkpoints are deleted afterwards: a sub-run is a measurement.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from currytrain.check.stage import Finding, StageContext, Status
from currytrain.components import build_components
from currytrain.conf import app_config, app_root
from currytrain.errors import Aborted, ConfigError, RunFailed
from currytrain.journal import Journal
from currytrain.logger.base import RunGroup, group_name, read_group, record_group
from currytrain.weights import RESOLVED

SUB_RUN_DEFAULTS = ("trainer.progress=false", "trainer.resume=none", "trainer.checkpoint_every=0")
"""What every sub-run sets besides check=none (no nested ladder) and logger.jsonl (its metrics.jsonl, beside the
ladder's other loggers): it trains quietly, from scratch."""


@dataclass
class SubRun:
    name: str
    path: Path
    val_loss: float
    """Final val loss (nats/token); nan when the run diverged."""
    train_loss: float
    """Mean train loss over the last tenth of the steps (the capacity and scaling stages fit this)."""
    num_params: int
    seconds: float
    ending: str
    """finish, or failure/abort with the reason in `message`."""
    message: str = ""
    measured: dict = field(default_factory=dict)
    """What the caller's `measure(trainer)` returned after training (probe accuracy, ...)."""

    @property
    def finished(self) -> bool:
        return self.ending == "finish" and math.isfinite(self.val_loss)


def derive(cfg: DictConfig, overrides: list[str], replace: dict[str, Any] | None = None) -> DictConfig:
    """A copy of the resolved `cfg` with overrides ("optimizer.lr=1e-5", "+x.y=1") read by Hydra's own override
    grammar, after the sub-run defaults. These set values; options of a group (model=moe) are chosen before,
    by `recompose`. `replace` swaps whole nodes ({"data": {...}}) before the overrides apply."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    tree = OmegaConf.to_container(cfg, resolve=True)
    tree["check"] = {"_target_": None}
    # The ladder's trackers (its sub-runs nest under its run there: RunGroup), and metrics.jsonl for compare.
    tree["logger"] = {**(tree.get("logger") or {}), "jsonl": {"_target_": "currytrain.logger.jsonl.JsonlLogger", "filename": "metrics.jsonl"}}
    tree.update(replace or {})
    derived = OmegaConf.create(tree)
    for override in OverridesParser.create().parse_overrides([*SUB_RUN_DEFAULTS, *overrides]):
        key = override.key_or_group
        if not override.is_add() and OmegaConf.select(derived, key, default=_MISSING) is _MISSING:
            raise ConfigError(f"{override.input_line}: {key} is not a key of the config; prefix it with + to add one")
        OmegaConf.update(derived, key, override.value(), force_add=True)
    return derived


_MISSING = object()


def group_choices(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """The overrides that choose an option of a config group (model=moe, model/size=tiny, experiment=my_idea)
    rather than set a value: their key is no value of `cfg` and Hydra knows it as a group."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    candidates = [o for o in parsed if not o.is_add() and not o.is_delete() and not _is_value(cfg, o.key_or_group)]
    if not candidates:
        return []
    with hydra_context() as (loader, _):
        return [o.input_line for o in candidates if loader.get_group_options(o.key_or_group)]


def _is_value(cfg: DictConfig, key: str) -> bool:
    node = OmegaConf.select(cfg, key, default=_MISSING) if "/" not in key else _MISSING
    return node is not _MISSING and not isinstance(node, DictConfig)


def recompose(ctx: StageContext, overrides: list[str]) -> DictConfig:
    """The run composed again by Hydra from its own overrides (ctx.overrides) plus `overrides`, which may choose
    other options of groups (model=moe, experiment=my_idea). An unknown option raises ConfigError with
    Hydra's message, which lists the valid ones (exit code 2)."""
    from hydra import compose
    from hydra.errors import HydraException

    own = [o for o in ctx.overrides if not o.startswith(("hydra.", "hydra/"))]
    with hydra_context() as (_, config_name):
        try:
            return compose(config_name=config_name, overrides=[*own, *overrides])
        except HydraException as error:
            message = str(error).split("\nConfig search path:")[0]
            raise ConfigError(f"{' '.join(overrides)}: {message}") from None


@contextlib.contextmanager
def hydra_context():
    """(config loader, root config name) of the running Hydra app (launch.py, or a project's app with its own
    search path); outside one (a worker process of parallel.nproc > 1, the `currytrain` command, a test), of the
    app the working directory belongs to (currytrain.conf.app_root), else of curryTrain's conf/. The schemas must be in Hydra's ConfigStore: the entry points store them
    (currytrain.config.register_configs), which this layer, below the config root, does not import."""
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    if GlobalHydra.instance().is_initialized():
        yield GlobalHydra.instance().config_loader(), HydraConfig.get().job.config_name if HydraConfig.initialized() else "config"
        return
    assert "root_schema.yaml" in ConfigStore.instance().repo, "register_configs() must run before a sub-run composes"
    config_dir, config_name = app_config(app_root())  # a project's worker: the project's tree, as its launch.py
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        yield GlobalHydra.instance().config_loader(), config_name


def arm_config(ctx: StageContext, overrides: list[str]) -> tuple[DictConfig, list[str]]:
    """(the config a sub-run with `overrides` starts from, the overrides left for `derive`): the ladder's own
    config when every override sets a value, else the run recomposed with the group choices among them."""
    choices = group_choices(ctx.cfg, overrides)
    if not choices:
        return ctx.cfg, list(overrides)
    return recompose(ctx, choices), [o for o in overrides if o not in choices]


def train_subrun(
    ctx: StageContext,
    stage: str,
    name: str,
    overrides: list[str],
    replace: dict[str, Any] | None = None,
    measure: Callable[[Any], dict] | None = None,
) -> SubRun:
    """Train the ladder's config with `overrides` (and `replace`d nodes) into <run>/<stage>/<name>/ and
    return how it went; `measure(trainer)` runs on the trained model when the run finished."""
    from currytrain.trainer.trainer import Trainer

    base, values = arm_config(ctx, overrides)
    cfg = derive(base, [*ctx.subrun_overrides, *values], replace)
    path = Path(ctx.run_dir) / stage / name
    write_record(cfg, path, overrides, ctx.state.is_main, ctx.state.world_size, group=subrun_group(ctx.run_dir, stage, name, overrides))
    started = time.perf_counter()
    journal = Journal(path / "journal.jsonl", enabled=ctx.state.is_main)
    trainer = None
    try:
        trainer = Trainer(cfg, path, ctx.state, components=build_components(cfg, ctx.state, shared_data(ctx, cfg)))
        val_loss, ending, message = trainer.train(), "finish", ""
        measured = measure(trainer) if measure else {}
    except (RunFailed, Aborted) as error:  # a diverged arm is a result, not a crash of the ladder
        val_loss, ending, message, measured = math.nan, "failure" if isinstance(error, RunFailed) else "abort", str(error), {}
        journal.event(ending, message=message, error=type(error).__name__)
    finally:
        shutil.rmtree(path / "checkpoints", ignore_errors=True)
    num_params = sum(p.numel() for p in trainer.model.parameters()) if trainer else 0
    result = SubRun(name, path, val_loss, tail_train_loss(path), num_params, time.perf_counter() - started, ending, message, measured)
    ctx.journal.event(
        "subrun", stage=stage, name=name, path=str(path), overrides=list(overrides), val_loss=val_loss, seconds=round(result.seconds, 2), **measured
    )
    return result


def shared_data(ctx: StageContext, cfg: DictConfig):
    """The data adapter for cfg.data, built once per distinct data config (reading a corpus takes seconds)."""
    from currytrain.build import build

    key = json.dumps(OmegaConf.to_container(cfg.data, resolve=True), sort_keys=True)
    if key not in ctx.datasets:
        ctx.datasets[key] = build(cfg.data)
    return ctx.datasets[key]


def write_record(cfg: DictConfig, path: Path, overrides: list[str], enabled: bool, world_size: int = 1, group: RunGroup | None = None) -> None:
    """resolved.yaml and the journal header, as a launched run has them, and the run's group (the trackers')."""
    if not enabled:
        return
    path.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, path / RESOLVED)
    diff = {override.partition("=")[0]: override.partition("=")[2] for override in overrides}
    journal = Journal(path / "journal.jsonl")
    journal.header(seed=cfg.seed, world_size=world_size, overrides=list(overrides), diff=diff, cwd=Path.cwd())
    record_group(journal, group)


def ladder_group(run_dir: Path) -> RunGroup:
    """The ladder's own run as the parent of its sub-runs' group (MLflow nests them under it; W&B and Aim
    group them by its name). A ladder that is itself a sweep's trial keeps the sweep's group (record_group)."""
    folder = Path(run_dir).resolve()
    return RunGroup(kind="ladder", name=group_name(folder), folder=str(folder), stores=str(folder.parent), job_type="ladder", role="ladder")


def subrun_group(run_dir: Path, stage: str, name: str, overrides: list[str]) -> RunGroup:
    """A sub-run's place under its ladder: stage, role (its name in the stage) and its overrides as params.
    It shares the ladder run's tracking stores, so that it can nest under that run."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    folder = Path(run_dir).resolve()
    ladder = read_group(folder)
    stores = ladder.stores if ladder is not None else str(folder.parent)
    name_in_trackers = ladder.name if ladder is not None and ladder.is_parent else group_name(folder)
    params = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(list(overrides)) if not o.is_delete()}
    return RunGroup(
        kind="ladder", name=name_in_trackers, folder=str(folder), stores=stores, member=f"{stage}/{name}", job_type=stage, stage=stage, role=name, params=params
    )


def tail_train_loss(path: Path, share: float = 0.1) -> float:
    """Mean train loss over the last `share` of the journaled steps (nan without any)."""
    from currytrain.journal import current, read_journal

    journal = path / "journal.jsonl"
    if not journal.is_file():
        return math.nan
    losses = [r["train/loss"] for r in current(read_journal(journal)) if r.get("type") == "metrics" and "train/loss" in r]
    tail = losses[-max(1, int(len(losses) * share)) :]
    return sum(tail) / len(tail) if tail else math.nan


# ------------------------------------------------------- the overrides the stages' sub-runs share

HIDDEN_FIELDS = ("mlp_hidden", "expert_hidden")
"""Model fields that grow with dim when the width changes (kept at the same ratio to dim)."""


def model_at_width(model_cfg: DictConfig, width: int) -> DictConfig:
    node = OmegaConf.to_container(model_cfg, resolve=True)
    ratio = width / node["dim"]
    node["dim"] = width
    for name in HIDDEN_FIELDS:
        if node.get(name):
            node[name] = max(1, round(node[name] * ratio))
    return OmegaConf.create(node)


def width_skipped(stage: str) -> Finding:
    """The finding of a stage that varies model.dim, for a model whose config has no such field."""
    return Finding(
        stage,
        Status.SKIPPED,
        "the model's config has no width field (model.dim) to vary",
        "a model whose width model.dim sets",
        "",
        "give the model a `dim` argument (and config field) to scale it",
    )


def width_overrides(model_cfg, width: int) -> list[str]:
    """The overrides that put the configured model at `width` (hidden sizes at the same ratio to dim)."""
    ratio = width / model_cfg.dim
    return [f"model.dim={width}"] + [f"model.{name}={max(1, round(model_cfg[name] * ratio))}" for name in HIDDEN_FIELDS if model_cfg.get(name)]


def budget_overrides(max_steps: int | None, overrides: list[str]) -> list[str]:
    """The sub-run budget (trainer.max_steps, evaluated once at the end) before the stage's own overrides."""
    if not max_steps:
        return list(overrides)
    return [f"trainer.max_steps={max_steps}", f"trainer.eval_every={max_steps}", *overrides]


def seed_overrides(ctx: StageContext, seed: int) -> list[str]:
    """seed, and data.seed beside it: the resolved config holds the value data.seed once interpolated."""
    return [f"seed={seed}"] + ([f"data.seed={seed}"] if "seed" in ctx.cfg.data else [])


def run_seeds(ctx: StageContext, stage: str, prefix: str, seeds: list[int], overrides: list[str]) -> list[SubRun]:
    return [train_subrun(ctx, stage, f"{prefix}seed_{seed}", [*overrides, *seed_overrides(ctx, seed)]) for seed in seeds]
