"""Short training runs that a stage starts in-process (seeds, ablation arms, model sizes).

Each sub-run is a real run folder below the ladder's: `<run>/<stage>/<name>/` with resolved.yaml, a journal
(header, metrics, finish) and jsonl metrics, so `currytrain compare <run>/<stage>` reads them like any
runs. It trains with the Trainer inside the parallel session the ladder already holds, and the ladder's own
journal gets one `subrun` event per sub-run. Checkpoints are deleted afterwards: a sub-run is a measurement.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from currytrain.check.stage import StageContext
from currytrain.components import build_components
from currytrain.errors import Aborted, ConfigError, RunFailed
from currytrain.journal import Journal
from currytrain.weights import RESOLVED

SUB_RUN_DEFAULTS = ("trainer.progress=false", "trainer.resume=none", "trainer.checkpoint_every=0")
"""What every sub-run sets besides check=none (no nested ladder) and logger=jsonl: it trains quietly, from scratch."""


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
    grammar, after the sub-run defaults. They set values; they cannot select another option of a group
    (model=moe), which needs a composition: the stage's runs are variations of the composed run. `replace`
    swaps whole nodes ({"data": {...}}) before the overrides apply."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    tree = OmegaConf.to_container(cfg, resolve=True)
    tree["check"] = {"_target_": None}
    tree["logger"] = {"jsonl": {"_target_": "currytrain.logger.jsonl.JsonlLogger", "filename": "metrics.jsonl"}}
    tree.update(replace or {})
    derived = OmegaConf.create(tree)
    for override in OverridesParser.create().parse_overrides([*SUB_RUN_DEFAULTS, *overrides]):
        key = override.key_or_group
        if not override.is_add() and OmegaConf.select(derived, key, default=_MISSING) is _MISSING:
            raise ConfigError(f"{override.input_line}: {key} is not a key of the config; prefix it with + to add one")
        OmegaConf.update(derived, key, override.value(), force_add=True)
    return derived


_MISSING = object()


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

    cfg = derive(ctx.cfg, overrides, replace)
    path = Path(ctx.run_dir) / stage / name
    write_record(cfg, path, overrides, ctx.state.is_main, ctx.state.world_size)
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


def write_record(cfg: DictConfig, path: Path, overrides: list[str], enabled: bool, world_size: int = 1) -> None:
    """resolved.yaml and the journal header, as a launched run has them."""
    if not enabled:
        return
    path.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, path / RESOLVED)
    diff = {override.partition("=")[0]: override.partition("=")[2] for override in overrides}
    Journal(path / "journal.jsonl").header(seed=cfg.seed, world_size=world_size, overrides=list(overrides), diff=diff, cwd=Path.cwd())


def tail_train_loss(path: Path, share: float = 0.1) -> float:
    """Mean train loss over the last `share` of the journaled steps (nan without any)."""
    from currytrain.journal import current, read_journal

    journal = path / "journal.jsonl"
    if not journal.is_file():
        return math.nan
    losses = [r["train/loss"] for r in current(read_journal(journal)) if r.get("type") == "metrics" and "train/loss" in r]
    tail = losses[-max(1, int(len(losses) * share)) :]
    return sum(tail) / len(tail) if tail else math.nan
