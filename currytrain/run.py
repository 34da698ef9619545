"""From a composed config to a finished run: write the run folder's record, then train.

compose (Hydra) -> validate -> resolved.yaml + journal header -> worker(s) read resolved.yaml -> train.
A job raises its outcome (currytrain.errors); launch.py alone turns it into an exit code.
"""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from currytrain.errors import Aborted, ConfigError, GateFailed, Pruned
from currytrain.journal import Journal, config_diff
from currytrain.validate import raise_on_problems, validate
from currytrain.weights import RESOLVED


def default_config() -> dict | None:
    """The root config with no overrides, for the journal's diff; None outside a Hydra context."""
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra

    if not GlobalHydra.instance().is_initialized():
        return None
    defaults = compose(config_name="config")
    return OmegaConf.to_container(defaults, resolve=True) if defaults else None


def write_run_record(cfg: DictConfig, run_dir: Path, overrides: list[str], cwd: Path) -> Path:
    """resolved.yaml (what the workers read) and the journal header. Called once, by the launching process."""
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved_path = run_dir / RESOLVED
    OmegaConf.save(OmegaConf.create(resolved), resolved_path)
    defaults = default_config()
    diff = config_diff(resolved, defaults) if defaults is not None else {}
    Journal(run_dir / "journal.jsonl").header(seed=cfg.seed, world_size=cfg.parallel.nproc, overrides=overrides, diff=diff, cwd=cwd)
    return resolved_path


def run(cfg: DictConfig) -> float | None:
    """Hydra task: record the run, then train in this process. Returns the final val loss (sweeps read it)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        # A single run was validated by ValidateCallback.on_run_start; a multirun's jobs are composed
        # after on_multirun_start, each with its own swept values and folder, so each is checked here.
        # A bad job raises: the launcher records it and the other jobs still run.
        raise_on_problems(validate(cfg, str(run_dir)))
    resolved_path = write_run_record(cfg, run_dir, list(hydra_cfg.overrides.task), Path(hydra_cfg.runtime.cwd))
    return run_worker(resolved_path)


# How a run that did not finish is journaled, by outcome; anything else is a `failure` with its traceback.
OUTCOME_EVENTS = {ConfigError: "config_error", Aborted: "abort", Pruned: "pruned", GateFailed: "gate_failed"}


def journal_outcome(journal: Journal, error: BaseException) -> None:
    kind = next((name for cls, name in OUTCOME_EVENTS.items() if isinstance(error, cls)), "failure")
    fields = {"message": str(error), "error": type(error).__name__}
    if kind == "failure":
        fields["traceback"] = "".join(traceback.format_exception(error))
    journal.event(kind, **fields)


def run_worker(resolved_path: Path) -> float | None:
    """A worker's whole job: read the resolved config written by the launcher, open the parallel session
    (process groups, device) once, and train inside it (or, with check != none, climb the validation ladder
    instead; None is returned then). Every way the run ends is journaled (rank 0)."""
    from currytrain.components import parallel_session
    from currytrain.trainer.trainer import Trainer

    cfg = OmegaConf.load(resolved_path)
    run_dir = Path(resolved_path).parent
    journal = Journal(run_dir / "journal.jsonl", enabled=int(os.environ.get("RANK", "0")) == 0)
    try:
        with parallel_session(cfg) as state:
            if not state.is_main:  # one console: the other ranks say only what is wrong
                logging.getLogger("currytrain").setLevel(logging.WARNING)
            if cfg.check.get("_target_") is not None:  # check=<stage|sanity|ladder>: the ladder instead of training
                from currytrain.check.ladder import run_ladder

                run_ladder(cfg, state, run_dir, journal)
                return None
            val_loss = Trainer(cfg, run_dir, state, hooks=build_hooks(cfg)).train()
    except BaseException as error:
        journal_outcome(journal, error)
        raise
    if journal.enabled:
        print(f"final val loss {val_loss:.4f} nats/token | run folder: {run_dir}")
    return val_loss


def build_hooks(cfg: DictConfig) -> list:
    """The StepHooks this run's config asks for (abort conditions; sweep pruning lands with the sweeper)."""
    from currytrain.build import build

    abort = build(cfg.abort)
    return [] if abort is None else [abort]
