"""From a composed config to a finished run: write the run folder's record, then train.

compose (Hydra) -> validate -> resolved.yaml + journal header -> worker(s) read resolved.yaml -> train.
With parallel.nproc > 1 the workers are started here (currytrain.workers); under torchrun this is
rank 0, which publishes the run folder to the other ranks.
A job raises its outcome (currytrain.errors); launch.py alone turns it into an exit code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import traceback
from collections.abc import Iterator
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from currytrain.diskio import storage_failure
from currytrain.errors import Aborted, ConfigError, GateFailed, Interrupted, InterruptedStarting, Pruned
from currytrain.journal import Journal, config_diff
from currytrain.lock import acquire, holding
from currytrain.logger.base import record_group
from currytrain.parallel.dims import launched_world_size
from currytrain.sweep.group import job_group
from currytrain.validate import raise_on_problems, validate, validated
from currytrain.weights import RESOLVED


def default_config() -> dict | None:
    """The app's root config with no overrides, for the journal's diff; None outside a Hydra context."""
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    if not GlobalHydra.instance().is_initialized():
        return None
    # The app's own root: a project's launch.py composes conf/project.yaml, whose search path reaches curryTrain's.
    defaults = compose(config_name=HydraConfig.get().job.config_name)
    return OmegaConf.to_container(defaults, resolve=True) if defaults else None


def write_run_record(cfg: DictConfig, run_dir: Path, overrides: list[str], cwd: Path) -> Path:
    """resolved.yaml (what the workers read) and the journal header. Called once, by the launching process."""
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved_path = run_dir / RESOLVED
    OmegaConf.save(OmegaConf.create(resolved), resolved_path)
    defaults = default_config()
    diff = config_diff(resolved, defaults) if defaults is not None else {}
    world_size = launched_world_size(cfg.parallel.nproc)
    Journal(run_dir / "journal.jsonl").header(seed=cfg.seed, world_size=world_size, overrides=overrides, diff=diff, cwd=cwd)
    return resolved_path


def run(cfg: DictConfig) -> float | None:
    """Hydra task: record the run, then train (here, or in the workers it starts) or climb the validation
    ladder. Returns the final val loss (sweeps read it). Under submitit with several tasks, the tasks of
    rank > 0 train from rank 0's record."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from currytrain import workers

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    rank = workers.join_submitit_job(cfg.parallel.rendezvous_timeout) if workers.in_submitit_task() else 0  # before validation: it checks WORLD_SIZE
    if hydra_cfg.mode == RunMode.RUN and rank == 0 and not validated(run_dir):
        raise_on_problems(validate(cfg, str(run_dir)))  # a run whose callback did not validate it (never skipped)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        # A single run was validated by ValidateCallback.on_run_start; a multirun's jobs are composed
        # after on_multirun_start, each with its own swept values and folder, so each is checked here.
        # A bad job raises: the launcher records it and the other jobs still run.
        raise_on_problems(validate(cfg, str(run_dir)))
        if workers.under_torchrun():
            raise ConfigError("-m under torchrun: every rank would run every job; run the sweep with launch.py alone (parallel.nproc=N starts the workers)")
    if rank != 0:  # a submitit task of a multi-task job: rank 0 writes the record, this one trains from it
        workers.wait_for_record(run_dir)
        return run_worker(run_dir / RESOLVED)
    # One lock per run, held by the process that writes its record: a single run took it in validation, before
    # Hydra wrote into the folder; a multirun's job (a sweep trial) takes it here.
    lock = holding(run_dir) or acquire(run_dir)
    try:
        resolved_path = write_run_record(cfg, run_dir, list(hydra_cfg.overrides.task), Path(hydra_cfg.runtime.cwd))
        record_group(Journal(run_dir / "journal.jsonl"), job_group(hydra_cfg, run_dir))  # a sweep's trial: the trackers group it
        if lock.took_over is not None:
            journal_takeover(run_dir, lock.took_over)
        return start_workers(cfg, resolved_path)
    finally:
        lock.release()


def journal_takeover(run_dir: Path, took_over: dict) -> None:
    previous = took_over["previous"]
    logging.getLogger(__name__).warning(
        "took over the lock of %s from pid %s on %s (started %s): %s", run_dir, previous["pid"], previous["host"], previous["started"], took_over["reason"]
    )
    Journal(run_dir / "journal.jsonl").event("lock_takeover", **took_over)


def start_workers(cfg: DictConfig, resolved_path: Path) -> float:
    """Train from the written record: here (one process), in the workers started here (parallel.nproc > 1),
    or here as rank 0 of workers someone else started (torchrun, submitit), after telling them the folder."""
    from currytrain import workers

    if workers.in_submitit_task():
        workers.mark_record_ready(resolved_path.parent)
    elif workers.under_torchrun():
        workers.publish_run_dir(resolved_path.parent)
    elif cfg.parallel.nproc > 1:
        return workers.launch_workers(run_worker, resolved_path, cfg.parallel.nproc, cfg.parallel.hang_timeout)
    return run_worker(resolved_path)


# How a run that did not finish is journaled, by outcome; anything else is a `failure` with its traceback.
OUTCOME_EVENTS = {ConfigError: "config_error", Aborted: "abort", Pruned: "pruned", GateFailed: "gate_failed"}


def journal_outcome(journal: Journal, error: BaseException) -> None:
    if isinstance(error, Interrupted) and not isinstance(error, InterruptedStarting):
        return  # the Trainer journaled it, with the checkpoint it saved
    if isinstance(error, KeyboardInterrupt | InterruptedStarting):  # outside the training loop, or Ctrl-C twice: nothing saved
        signum = error.signum if isinstance(error, InterruptedStarting) else signal.SIGINT
        kind, fields = "interrupted", {"signal": signal.Signals(signum).name, "checkpoint": None}
    else:
        kind = next((name for cls, name in OUTCOME_EVENTS.items() if isinstance(error, cls)), "failure")
        fields = {"message": str(error), "error": type(error).__name__}
        if kind == "failure":
            fields["traceback"] = "".join(traceback.format_exception(error))
    try:
        journal.event(kind, **fields)
    except Exception as failed:  # the journal's own write failed (a full disk): the error being raised matters more
        logging.getLogger(__name__).warning("could not journal how the run ended: %s", failed)


def run_worker(resolved_path: Path) -> float | None:
    """A worker's whole job: read the resolved config written by the launcher, open the parallel session
    (process groups, device) once, and train inside it (or, with check != none, climb the validation ladder
    instead; None is returned then). Every way the run ends is journaled (rank 0)."""
    import torch

    from currytrain.components import parallel_session
    from currytrain.trainer.trainer import Trainer
    from currytrain.workers import worker_threads

    if "LOCAL_WORLD_SIZE" in os.environ:  # several workers on this machine: share its cores
        torch.set_num_threads(worker_threads())
    cfg = OmegaConf.load(resolved_path)
    run_dir = Path(resolved_path).parent
    journal = Journal(run_dir / "journal.jsonl", enabled=int(os.environ.get("RANK", "0")) == 0)
    try:
        with stopped_while_starting(), parallel_session(cfg) as state:
            if not state.is_main:  # one console: the other ranks say only what is wrong
                logging.getLogger("currytrain").setLevel(logging.WARNING)
            if cfg.check.get("_target_") is not None:  # check=<stage|sanity|ladder>: the ladder instead of training
                from currytrain.check.ladder import run_ladder
                from currytrain.config import register_configs

                register_configs()  # sub-runs compose variants of this run: outside Hydra (a worker) they need the schemas
                run_ladder(cfg, state, run_dir, journal)
                return None
            val_loss = Trainer(cfg, run_dir, state, hooks=build_hooks(cfg)).train()
    except BaseException as error:
        journal_outcome(journal, error)
        if (explained := storage_failure(error)) is not None:
            raise explained from error
        raise
    if journal.enabled:
        print(f"final val loss {val_loss:.4f} nats/token | run folder: {run_dir}")
    return val_loss


@contextlib.contextmanager
def stopped_while_starting() -> Iterator[None]:
    """SIGTERM while the run starts (data, model, compile: before the Trainer answers stop signals) ends it as an
    outcome, journaled, with exit 143, rather than killing the process with a journal that says nothing. Workers of
    torch's elastic agent keep SIGTERM's default (the agent's way to stop them: trainer.signals)."""
    import threading

    if "TORCHELASTIC_RUN_ID" in os.environ or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise InterruptedStarting(
            f"stopped by {signal.Signals(signum).name} outside the training loop (while the run started or ended): no checkpoint saved", signum
        )

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_hooks(cfg: DictConfig) -> list:
    """The StepHooks this run asks for: its abort conditions, and the sweep's pruning when it is a trial."""
    from currytrain.build import build
    from currytrain.sweep.study import trial_from_env

    hooks = [build(cfg.abort)]
    if trial_from_env() is not None:  # a trial of an Optuna sweep (the sweeper set its environment)
        from currytrain.sweep.pruning import build_pruning_hook

        hooks.append(build_pruning_hook())
    return [hook for hook in hooks if hook is not None]
