"""From a composed config to a finished run: write the run folder's record, then train.

compose (Hydra) -> validate -> resolved.yaml + journal header -> worker(s) read resolved.yaml -> train.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from currytrain.errors import ConfigError
from currytrain.journal import Journal, config_diff
from currytrain.validate import exit_on_problems, validate
from currytrain.weights import RESOLVED

log = logging.getLogger(__name__)


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


def run(cfg: DictConfig) -> float:
    """Hydra task: record the run, then train in this process. Returns the final val loss (sweeps read it)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        # A single run was validated by ValidateCallback.on_run_start; a multirun's jobs are composed
        # after on_multirun_start, each with its own swept values and folder, so each is checked here.
        exit_on_problems(validate(cfg, str(run_dir)))
    resolved_path = write_run_record(cfg, run_dir, list(hydra_cfg.overrides.task), Path(hydra_cfg.runtime.cwd))
    try:
        return run_worker(resolved_path)
    except ConfigError as error:
        # What validation cannot see before building (a corpus shorter than one sequence): still the
        # user's to fix, so one message and exit code 2 rather than a traceback.
        Journal(run_dir / "journal.jsonl").event("config_error", message=str(error))
        exit_on_problems([str(error)])
        raise  # unreachable: exit_on_problems exits


def run_worker(resolved_path: Path) -> float:
    """A worker's whole job: read the resolved config written by the launcher and train."""
    from currytrain.trainer.trainer import Trainer

    cfg = OmegaConf.load(resolved_path)
    run_dir = Path(resolved_path).parent
    val_loss = Trainer(cfg, run_dir).train()
    print(f"final val loss {val_loss:.4f} nats/token | run folder: {run_dir}")
    return val_loss
