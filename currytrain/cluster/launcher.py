"""hydra/launcher=slurm: hydra-submitit-launcher's SlurmLauncher as curryTrain runs it (conf/hydra/launcher/slurm.yaml;
the class is hydra_plugins/currytrain_launcher/slurm.py's, as Hydra requires, and calls the functions here).

In the launching process:
- no sbatch on this machine, or a job sbatch refuses (partition, account, gres, ...): a ConfigError (exit 2)
  with sbatch's own message, before any job runs;
- each job's id and where its tasks' logs are, then its state each time it changes (squeue: no accounting
  database needed, so none of submitit's sacct warnings), also appended to <multirun>/slurm_jobs.jsonl, which
  `currytrain diagnose <multirun>` reads;
- a failed job's outcome raised again here (errors.JobFailed), so launch.py exits with its code.

In each task of a job (SLURM runs one per rank; ranks and the rendezvous are currytrain.workers'):
- a job SLURM started again (requeued: SLURM_RESTART_COUNT > 0) journals `requeued` and resumes from the run
  folder's newest checkpoint (trainer.resume=auto);
- a run stopped by SLURM's warning signal (`--signal`, submitit's USR2 before the time limit, or SIGUSR1 from
  `scancel --signal=USR1`) has saved a checkpoint; rank 0 then requeues the job, at most
  hydra.launcher.max_num_timeout times;
- a task whose job failed exits non-zero, so that SLURM ends the job's other tasks (SLURM_KILL_BAD_EXIT=1)
  instead of leaving them waiting for it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import submitit
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job
from omegaconf import OmegaConf, open_dict
from submitit.core.utils import FailedJobError
from submitit.slurm.slurm import SlurmExecutor, SlurmInfoWatcher, SlurmJob

from currytrain.cluster import slurm
from currytrain.errors import EXIT_SIGNAL_BASE, ConfigError, Interrupted, JobFailed, Outcome, Pruned, RunFailed, exit_code_of
from currytrain.journal import Journal

log = logging.getLogger(__name__)

POLL_S = 1.0
"""How often the launcher asks squeue about its jobs."""
FINAL_STATE_WAIT_S = 15.0
"""After a job's last result: how long the launcher waits for SLURM to see its tasks end before it counts the
job as ended anyway."""
KILL_BAD_EXIT = "export SLURM_KILL_BAD_EXIT=1"
"""A setup line of every batch script: srun ends a job's tasks as soon as one exits non-zero."""


def require_sbatch() -> None:
    if slurm.sbatch() is None:
        raise ConfigError(
            "hydra/launcher=slurm submits jobs with SLURM's sbatch, which is not on this machine's PATH: run this on a "
            "SLURM login node, or pass hydra/launcher=slurm_local to run the same tasks as local processes"
        )


@contextlib.contextmanager
def sbatch_refusals() -> Iterator[None]:
    """sbatch refusing a job (an unknown partition or account, gres the cluster lacks, a time over the limit)."""
    try:
        yield
    except FailedJobError as error:
        message = " ".join(str(error).split())
        raise ConfigError(
            f"sbatch refused the job: {message}. Nothing was submitted: fix the hydra.launcher key it names "
            "(partition, account, qos, gres, gpus_per_node, mem_gb, timeout_min; `sinfo` lists partitions and limits)"
        ) from None


# ---------------------------------------------------------------------------------- submitit, via squeue


class QueueWatcher(SlurmInfoWatcher):
    """submitit's job-state watcher asking squeue instead of sacct: sacct needs SLURM's accounting database,
    which many clusters lack (submitit then warns on every poll and never sees a job die)."""

    def _make_command(self) -> list[str] | None:
        ids = sorted(self._registered - self._finished)
        return ["squeue", "-h", "-r", "--states=all", "-j", ",".join(ids), "-O", "JobArrayID:|,State:|,NodeList:|"] if ids else None

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        info = {job_id: {"JobID": job_id, "State": slurm.GONE} for job_id in self._registered - self._finished}
        for line in text.splitlines():
            job_id, state, nodes, *_ = [*(part.strip() for part in line.split("|")), "", "", ""]
            if job_id:
                info[job_id] = {"JobID": job_id, "State": state, "NodeList": nodes}
        return info


class QueueJob(SlurmJob):
    watcher = QueueWatcher(delay_s=60)
    _results_timeout_s = 5  # a task that ended without a result: say so after 5 s, not 15


class QueueExecutor(SlurmExecutor):
    job_class = QueueJob


# ------------------------------------------------------------------------------------------- the jobs


def task_paths(job: Any, task: int) -> Any:
    return job.task(task).paths


class JobWatch:
    """Follows submitted jobs: where each task's log is when it is submitted, then each job's state as it
    changes (one squeue for all of them per poll), on the console and in the multirun's slurm_jobs.jsonl."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.jobs: dict[str, slurm.JobRecord] = {}
        self.states: dict[str, slurm.JobState] = {}
        self.results_at: dict[str, float] = {}

    def add(self, job: Any, job_num: int, label: str) -> None:
        tasks = job.num_tasks
        logs = [str(path) for task in range(tasks) for path in (task_paths(job, task).stderr, task_paths(job, task).stdout)]
        record = slurm.JobRecord(job_id=job.job_id, job_num=job_num, label=label, state="SUBMITTED", description="submitted", tasks=tasks, logs=logs)
        self.jobs[job.job_id] = record
        slurm.append_record(self.folder, record)
        pattern = str(task_paths(job, 0).stdout).replace(f"_{0}_log.out", "_<task>_log.out")
        log.info("SLURM job %s submitted (%s, %d task%s): each task's output in %s (stderr: .err)", job.job_id, label, tasks, "s" * (tasks > 1), pattern)

    def poll(self) -> None:
        unfinished = [job_id for job_id in self.jobs if not (job_id in self.states and self.states[job_id].finished)]
        states = slurm.job_states(unfinished)
        for job_id, state in (states or {}).items():
            self.states[job_id] = state
            record = self.jobs[job_id]
            description = state.describe()
            if description != record.description:
                record.state, record.description = state.state, description
                slurm.append_record(self.folder, record)
                log.info("SLURM job %s (%s): %s", job_id, record.label, description)

    def done(self, job: Any) -> bool:
        """The controller says the job ended (with its results or, killed, without), or every task left its
        result FINAL_STATE_WAIT_S ago: the tasks exit right after writing it, so the job's slot is free once
        SLURM has seen them go (squeue then lists no more jobs than the sweep keeps in flight)."""
        state = self.states.get(job.job_id)
        if state is not None and state.finished:
            return True
        if not all(task_paths(job, task).result_pickle.exists() for task in range(job.num_tasks)):
            return False
        seen = self.results_at.setdefault(job.job_id, time.monotonic())
        return time.monotonic() - seen > FINAL_STATE_WAIT_S

    def wait(self, jobs: Sequence[Any]) -> None:
        while True:
            self.poll()
            if all(self.done(job) for job in jobs):
                return
            time.sleep(POLL_S if not self.results_at else POLL_S / 4)

    def job_return(self, job: Any) -> JobReturn | BaseException:
        """The job's JobReturn: the first failed task's (rank order), else task 0's; or, when a task left no
        result (killed, its node lost), the error saying so with the end of its stderr."""
        results: list[Any] = []
        for task in range(job.num_tasks):
            try:
                results.append(job.task(task).result())
            except Exception as error:  # no result: submitit's UncompletedJobError, or the task's own traceback
                results.append(error)
        failed = next((r for r in results if isinstance(r, JobReturn) and r.status == JobStatus.FAILED), None)
        if failed is not None:
            return failed
        missing = next((task for task, r in enumerate(results) if not isinstance(r, JobReturn)), None)
        if missing is None:
            return results[0]
        state = self.states.get(job.job_id)
        tail = "\n".join(slurm.stderr_tail(task_paths(job, missing).stderr))
        return RunFailed(
            f"SLURM job {job.job_id}: task {missing} ended without a result ({state.describe() if state else 'state unknown'}); "
            f"its stderr ({task_paths(job, missing).stderr}) ends:\n{tail}"
        )


# ------------------------------------------------------------------------------------------ the launcher
# Hydra accepts launcher classes from the hydra_plugins package only: the class behind hydra/launcher=slurm is
# hydra_plugins/currytrain_launcher/slurm.py's, and its methods call these functions with itself.


def build_executor(launcher: Any) -> QueueExecutor:
    """The executor for a submitit SLURM launcher's parameters (hydra.launcher.*), its jobs watched with squeue."""
    require_sbatch()
    params = {key: value for key, value in launcher.params.items() if value is not None}
    executor = QueueExecutor(folder=params.pop("submitit_folder"), max_num_timeout=params.pop("max_num_timeout", 0))
    params["setup"] = [*params.get("setup", []), KILL_BAD_EXIT]
    executor.update_parameters(**executor._convert_parameters(params))
    return executor


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    """Submit the jobs (an array job for several), show their states until all ended, and return their results."""
    config = launcher.config
    executor = build_executor(launcher)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    calls = []
    for number, overrides in enumerate(job_overrides, initial_job_idx):
        log.info("\t#%d : %s", number, " ".join(filter_overrides(overrides)))
        calls.append((list(overrides), "hydra.sweep.dir", number, f"job_id_for_{number}", Singleton.get_state()))
    with sbatch_refusals():
        jobs = executor.map_array(launcher, *zip(*calls))
    watch = JobWatch(sweep_dir)
    for (_, _, number, _, _), job in zip(calls, jobs):
        watch.add(job, number, f"#{number}")
    try:
        watch.wait(jobs)
    except KeyboardInterrupt:  # Ctrl-C stops the watching, not the jobs
        log.warning("stopped watching; the jobs keep running (scancel %s stops them)", " ".join(job.job_id for job in jobs))
        raise
    return [relayed(watch.job_return(job), call[0]) for job, call in zip(jobs, calls)]


def relayed(result: JobReturn | BaseException, overrides: list[str]) -> JobReturn:
    """A failed job's outcome as errors.JobFailed, which Hydra raises in this process when it reads the result,
    so launch.py exits with that outcome's code (Hydra would print any Exception and exit 1)."""
    if isinstance(result, BaseException):
        result = JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=result)
    if result.status == JobStatus.FAILED and not isinstance(result._return_value, Pruned):  # a sweeper reads Pruned
        error = result._return_value
        outcome = error if isinstance(error, Outcome) else RunFailed(f"{type(error).__name__}: {error}")
        result._return_value = JobFailed(outcome)
    return result


def run_in_task(launcher: Any, sweep_overrides: list[str], job_dir_key: str, job_num: int) -> JobReturn:
    """What each task of a job runs: the Hydra job (composed here from the launcher's config and the job's
    overrides), continuing a requeued job from its checkpoint, requeueing after SLURM's warning signal, and
    exiting non-zero when the job failed."""
    config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(sweep_overrides))
    job = submitit.JobEnvironment()
    with open_dict(config.hydra.job):
        config.hydra.job.id = job.job_id
        config.hydra.job.num = job_num
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    if restarts:
        continue_requeued(config, job, restarts)
    try:
        result = run_job(
            hydra_context=launcher.hydra_context,
            task_function=launcher.task_function,
            config=config,
            job_dir_key=job_dir_key,
            job_subdir_key="hydra.sweep.subdir",
        )
    except SystemExit as stop:  # the run stopped on a signal, after its checkpoint (app.run_task exits 128 + N)
        result = after_signal(stop, job, restarts, int(launcher.params.get("max_num_timeout") or 0), list(sweep_overrides))
    code = 0
    if result.status == JobStatus.FAILED and not isinstance(result._return_value, Pruned):
        error = result._return_value
        print(f"curryTrain: SLURM job {job.job_id}, task {job.global_rank}: {type(error).__name__}: {error}", file=sys.stderr)
        if not isinstance(error, Outcome):  # a crash: its traceback, for the task's log
            traceback.print_exception(error)
        code = exit_code_of(error)
    exit_when_done(code)
    return result


def after_signal(stop: SystemExit, job: Any, restarts: int, max_requeues: int, overrides: list[str]) -> JobReturn:
    """A task whose run stopped on a signal. SIGTERM (scancel, a pre-emption, `scontrol requeue`): the task exits,
    leaving no result, and SLURM decides whether the job runs again. SLURM's warning (USR1, or submitit's USR2):
    rank 0 requeues the job, at most `max_requeues` times, and the other ranks exit 0 (so that srun does not
    stop rank 0 first); past that the job ends here, its outcome the Interrupted that names the checkpoint."""
    code = stop.code if isinstance(stop.code, int) else 1
    signum = code - EXIT_SIGNAL_BASE
    if signum not in warning_signals():
        raise stop
    if job.global_rank != 0:
        raise SystemExit(0)
    name = signal.Signals(signum).name
    if restarts < max_requeues:
        error = slurm.requeue(job.job_id)
        if error is None:
            log.warning(
                "SLURM job %s requeued after %s (requeue %d of at most %d): it continues from its checkpoint", job.job_id, name, restarts + 1, max_requeues
            )
            raise SystemExit(0)
        reason = f"scontrol requeue failed: {error}"
    else:
        reason = f"it was requeued {restarts} time(s) already (hydra.launcher.max_num_timeout={max_requeues})"
    interrupted = Interrupted(
        f"SLURM job {job.job_id} stopped on {name}, after a checkpoint, and was not requeued: {reason}. Continue it with the same "
        "command plus trainer.resume=auto and the same hydra.sweep.dir (or raise hydra.launcher.max_num_timeout / timeout_min)",
        signum,
    )
    return JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=interrupted)


def warning_signals() -> set[int]:
    """SLURM's warning before a job's end: SIGUSR1 (`scancel --signal=USR1`, `--signal=USR1@T`), and the signal
    submitit asks for before the time limit (`--signal=USR2@<hydra.launcher.signal_delay_s>`; its
    SUBMITIT_PREEMPT_SIGNAL names another)."""
    return {signal.SIGUSR1, signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]}


def continue_requeued(config: Any, job: Any, restarts: int) -> None:
    """A job SLURM started again: resume from the run folder's newest checkpoint if it holds one (else the run
    starts as first configured), and journal the requeue (rank 0, into a journal the first start began)."""
    run_dir = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
    has_checkpoint = any((run_dir / "checkpoints").glob("step_*"))
    if has_checkpoint and OmegaConf.select(config, "trainer.resume") is not None:
        with open_dict(config):
            config.trainer.resume = "auto"
    journal = run_dir / "journal.jsonl"
    if job.global_rank == 0 and journal.is_file():
        Journal(journal).event("requeued", job=job.job_id, restart=restarts, resume="auto" if has_checkpoint else "none (no checkpoint yet)")
    log.info(
        "SLURM job %s started again (restart %d): %s", job.job_id, restarts, "resuming from the newest checkpoint" if has_checkpoint else "no checkpoint yet"
    )


def exit_when_done(code: int) -> None:
    """Exit with `code` as soon as submitit has saved this task's result. A job whose task failed must not end
    as COMPLETED, and with SLURM_KILL_BAD_EXIT srun then ends the job's other tasks, which may be waiting for
    this one. Either way the task skips the interpreter's teardown of torch (seconds), which would hold the
    job's nodes after its result is in (the run's loggers and files were closed by then)."""

    def leave() -> None:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    atexit.register(leave)
