"""Starting a run's worker processes, and agreeing on one run folder whoever started them.

- `parallel.nproc=N`: launch.py composes once, writes the run record, then starts N workers through torch's
  elastic agent (elastic_launch, the API behind torchrun); each runs run_worker(resolved.yaml). Their
  stdout/stderr go to <run>/workers/rank_<r>.{stdout,stderr} (rank 0's is also shown). A worker that
  fails or is killed stops the others; the launcher journals which rank and how, and raises its outcome.
- SLURM (or submitit_local) through hydra-submitit-launcher with tasks_per_node = parallel.nproc: every
  task runs the Hydra job; ranks, world size and the master address come from submitit's JobEnvironment
  (a first node whose name does not resolve is reached by its NodeAddr). The ranks meet at rank 0's store
  within parallel.rendezvous_timeout, or fail naming the address and the ranks seen. Rank 0 writes the
  record, the others wait for it through that store, and all train together.
- The user's own `torchrun --nproc_per_node N launch.py ...`: rank 0 runs Hydra and writes the record, then
  publishes the run folder in torchrun's store; the other ranks never compose: they wait for that folder
  and read its resolved.yaml (Hydra's ${now:} would give each process its own folder).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from currytrain.cluster import slurm
from currytrain.errors import Aborted, ConfigError, GateFailed, Interrupted, Outcome, Pruned, RunFailed, exit_code_of
from currytrain.journal import Journal, resume_command
from currytrain.weights import RESOLVED

log = logging.getLogger(__name__)

WORKERS_DIR = "workers"

WorkerEntry = Callable[[Path], "float | None"]
"""A worker's whole job, given the run record (resolved.yaml): run.run_worker. The launcher passes it in, so
this module, below run.py, never imports it back."""
OUTCOMES = {cls.__name__: cls for cls in (ConfigError, RunFailed, GateFailed, Aborted, Pruned)}
RUN_DIR_WAIT = timedelta(minutes=30)
"""How long torchrun's other ranks wait for rank 0 to compose and write the run record."""


def under_torchrun() -> bool:
    """True in a process torchrun (or another elastic agent) started with launch.py as its script."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_threads() -> int:
    """torch threads per worker: the cores this process may use, shared by the workers of this machine, and in
    a SLURM job no more than it gave each task (hydra.launcher.cpus_per_task; else the node's CPUs of the job
    shared by its tasks there), for clusters that do not bind tasks to their CPUs."""
    cores = available_cores()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    threads = cores // local
    if os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        threads = min(threads, int(os.environ["SLURM_CPUS_PER_TASK"]))
    elif os.environ.get("SLURM_CPUS_ON_NODE", "").isdigit():
        threads = min(threads, int(os.environ["SLURM_CPUS_ON_NODE"]) // local)
    return max(1, threads)


# ------------------------------------------------------------------------------------- parallel.nproc=N


def launch_workers(entry: WorkerEntry, resolved_path: Path, nproc: int, hang_timeout: float = 0.0) -> float:
    """Run `nproc` workers on this machine and return rank 0's final val loss; raise the failed rank's outcome.
    hang_timeout (parallel.hang_timeout): seconds without any worker's heartbeat before HangWatch stops them."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    run_dir = Path(resolved_path).parent
    # The agent would log each failed worker's traceback again; it is in workers/rank_<r>.stderr already,
    # and the launcher journals the failure and raises its outcome (one message on the console).
    for name in ("torch.distributed.elastic", "torch.multiprocessing.spawn"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"currytrain-{os.getpid()}",
        role="rank",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, as `torchrun --standalone` picks
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        shutdown_timeout=1,  # after one worker failed, the others get 1 s to exit before SIGKILL
        # SIGINT and SIGTERM are this launcher's (_stop_file_for_signals): the workers stop after a checkpoint.
        signals_to_handle="SIGHUP,SIGQUIT",
        logs_specs=_run_folder_logs(run_dir / WORKERS_DIR),
    )
    for stale in (run_dir / WORKERS_DIR).glob("rank_*.outcome.json"):  # a relaunch's failures are its own
        stale.unlink()
    watch = HangWatch(run_dir, hang_timeout)
    try:
        with _stop_file_for_signals(run_dir / WORKERS_DIR / STOP_FILE), watch:
            results = elastic_launch(config, worker_entry)(entry, str(resolved_path))
    except ChildFailedError as error:
        if watch.verdict is not None:  # the watch stopped them: its verdict, not the SIGKILLs it sent
            raise RunFailed(watch.verdict) from None
        raise _outcome_of(run_dir, error.failures) from None
    except SignalException as error:  # a second signal (or SIGHUP, SIGQUIT) to the launcher: the agent stopped the workers
        name = signal.Signals(error.sigval).name
        Journal(run_dir / "journal.jsonl").event("interrupted", signal=name, checkpoint=None, by="launcher")
        raise Interrupted(
            f"stopped by {name}: the workers were stopped at once, without a checkpoint; continue from the newest: {resume_command(run_dir)}",
            error.sigval,
        ) from None
    return results[0]


class HangWatch:
    """Watches the workers' heartbeats (currytrain/trainer/heartbeat.py) from the launcher. When none of this
    launch's workers has beaten for `timeout` seconds, the run is hung: every rank waits in a collective for
    the one furthest behind. The watch journals `worker_hung` naming that rank, and SIGKILLs every worker, so
    that the agent ends the run and no process is left behind. timeout 0: no watch."""

    def __init__(self, run_dir: Path, timeout: float):
        self.run_dir, self.timeout = run_dir, timeout
        self.verdict: str | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.watch, name="currytrain-hang-watch", daemon=True)

    def __enter__(self) -> HangWatch:
        self.started = time.time()  # beats older than this are a previous launch's (a resume into the folder)
        if self.timeout > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join()

    def watch(self) -> None:
        from currytrain.trainer.heartbeat import PHASE_WORDS, progress, read_heartbeats

        while not self.stopped.wait(min(5.0, self.timeout / 4)):
            beats = {rank: beat for rank, beat in read_heartbeats(self.run_dir).items() if beat.get("time", 0) >= self.started}
            if not beats or time.time() - max(beat["time"] for beat in beats.values()) < self.timeout:
                continue
            rank = min(beats, key=lambda r: (progress(beats[r]), r))
            beat = beats[rank]
            waited = round(time.time() - beat["time"], 1)
            self.verdict = (
                f"the run hung: rank {rank} stopped at step {beat['step']}, {PHASE_WORDS.get(beat['phase'], beat['phase'])}, "
                f"and no worker has moved for {waited} s (parallel.hang_timeout={self.timeout:g}), so every worker was stopped. "
                f"See workers/rank_{rank}.stderr and `currytrain diagnose {self.run_dir}`; continue: {resume_command(self.run_dir)}"
            )
            Journal(self.run_dir / "journal.jsonl").event("worker_hung", rank=rank, step=beat["step"], phase=beat["phase"], seconds=waited)
            log.error("%s", self.verdict)
            for other in beats.values():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(other["pid"], signal.SIGKILL)
            return


STOP_FILE = "stop"
"""workers/stop: the stop signal the launcher received, for its workers to agree on a step to stop after."""


@contextlib.contextmanager
def _stop_file_for_signals(stop_file: Path) -> Iterator[None]:
    """While the workers run, the first SIGINT, SIGTERM or SIGUSR1 to this launcher is written into
    `stop_file` (its name) instead of stopping the workers: they read it at their next fetch step, agree on
    it (Trainer.agreed_stop), save a checkpoint and exit 128+N. A second one stops them at once (torch's
    agent then sends them that signal). Elsewhere than in the main thread, signals keep their handlers."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from currytrain.trainer.signals import STOP_FILE_ENV, STOP_SIGNALS

    stop_file.parent.mkdir(parents=True, exist_ok=True)
    stop_file.unlink(missing_ok=True)  # a relaunch into this folder must not find the last one's
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def note(signum: int, frame: object) -> None:
        if stop_file.exists():
            raise SignalException(f"{signal.Signals(signum).name} received twice: stopping the workers now", sigval=signal.Signals(signum))
        stop_file.write_text(signal.Signals(signum).name)
        log.warning("%s received: the workers stop after their next log step, with a checkpoint (again to stop them at once)", signal.Signals(signum).name)

    saved = os.environ.get(STOP_FILE_ENV)
    os.environ[STOP_FILE_ENV] = str(stop_file)  # the workers inherit it
    previous = {signum: signal.signal(signum, note) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if saved is None:
            os.environ.pop(STOP_FILE_ENV, None)
        else:
            os.environ[STOP_FILE_ENV] = saved
        stop_file.unlink(missing_ok=True)


def _run_folder_logs(folder: Path) -> Any:
    from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, Std

    class RunFolderLogs(LogsSpecs):
        """Each worker's stdout/stderr as workers/rank_<r>.{stdout,stderr}; rank 0's shown on the console,
        the other ranks' stderr too (warnings and errors)."""

        def __init__(self) -> None:
            super().__init__(log_dir=str(folder), redirects=Std.ALL)

        @property
        def root_log_dir(self) -> str:
            return str(folder)

        def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
            folder.mkdir(parents=True, exist_ok=True)
            ranks = range(len(envs))
            name = {rank: str(folder / f"rank_{envs[rank].get('RANK', rank)}") for rank in ranks}
            return LogsDest(
                stdouts={rank: f"{name[rank]}.stdout" for rank in ranks},
                stderrs={rank: f"{name[rank]}.stderr" for rank in ranks},
                tee_stdouts={0: f"{name[0]}.stdout"},
                tee_stderrs={rank: f"{name[rank]}.stderr" for rank in ranks},
                error_files={rank: f"{name[rank]}.error.json" for rank in ranks},
            )

    return RunFolderLogs()


def worker_entry(entry: WorkerEntry, resolved_path: str) -> float:
    """What each worker process runs (module level, so the spawn start method can import it): `entry`, the
    launcher's module-level job function (run.run_worker), which pickles by name."""
    rank = int(os.environ["RANK"])
    # When a peer fails, the agent stops this worker with SIGTERM, perhaps while it waits inside a gloo
    # collective for the dead peer: the default action ends it there (a Python handler would wait).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(f"curryTrain worker rank {rank} pid {os.getpid()}", flush=True)
    _log_to_stderr()
    try:
        return entry(Path(resolved_path))  # run_worker journals how the run ended (rank 0)
    except BaseException as error:
        _leave(error, Path(resolved_path).parent / WORKERS_DIR / f"rank_{rank}.outcome.json")


def _log_to_stderr() -> None:
    """curryTrain's messages on this worker's stderr (workers/rank_<r>.stderr, which the launcher shows), as a
    one-process run logs them; the ranks after the first say only what is wrong (one console)."""
    logger = logging.getLogger("currytrain")
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO if int(os.environ.get("RANK", "0")) == 0 else logging.WARNING)


def _leave(error: BaseException, outcome_file: Path) -> None:
    """End a failed worker now. A typed outcome is left for the launcher to raise again (a config error still
    exits 2). The process exits without interpreter teardown: with a peer gone, tearing down torch and the
    process group can take seconds, and the agent stops the other workers only once this one is gone."""
    if isinstance(error, Outcome):
        signum = {"signum": int(error.signum)} if isinstance(error, Interrupted) else {}
        outcome_file.write_text(json.dumps({"error": type(error).__name__, "message": str(error), **signum}))
    if not isinstance(error, Interrupted):  # a stop the ranks agreed on is no error: the launcher says it once
        traceback.print_exception(error)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code_of(error))


def _outcome_of(run_dir: Path, failures: dict[int, Any]) -> Outcome:
    """Journal the failed ranks; the outcome to raise is the first failure's (a signal before the errors
    it caused in the other ranks), or, if a rank raised a typed outcome, the earliest such one."""
    order = sorted(failures, key=lambda rank: (failures[rank].timestamp, failures[rank].exitcode >= 0, rank))
    first = order[0]
    # A stop signal the workers agreed on: each saved, rank 0 journaled it; not a failure.
    outcome_file = run_dir / WORKERS_DIR / f"rank_{first}.outcome.json"
    record = json.loads(outcome_file.read_text()) if outcome_file.exists() else {}
    if record.get("error") == "Interrupted":
        return Interrupted(record["message"], record["signum"])
    fields = {rank: {"exitcode": failures[rank].exitcode, "signal": failures[rank].signal_name(), "pid": failures[rank].pid} for rank in order}
    journal = Journal(run_dir / "journal.jsonl")
    stderr = run_dir / WORKERS_DIR / f"rank_{first}.stderr"
    journal.event("worker_failed", rank=first, how=_how(failures[first]), failures=fields, stderr=str(stderr))
    for rank in order:
        outcome_file = run_dir / WORKERS_DIR / f"rank_{rank}.outcome.json"
        if outcome_file.exists():
            record = json.loads(outcome_file.read_text())
            return OUTCOMES.get(record["error"], RunFailed)(record["message"])
    return RunFailed(f"worker rank {first} {_how(failures[first])}, so the run stopped: see {stderr}")


def _how(failure: Any) -> str:
    if failure.exitcode < 0:
        return f"was killed by {failure.signal_name()}"
    return f"exited with code {failure.exitcode}"


# -------------------------------------------------------------------------------------------- submitit


def in_submitit_task() -> bool:
    """True inside a job that submitit (SLURM or its local executor) started with more than one task."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return False
    import submitit

    return submitit.JobEnvironment().num_tasks > 1


MASTER_ADDR_ENV = "CURRYTRAIN_MASTER_ADDR"
"""An address of a job's first node that the other nodes reach, for clusters whose node names do not resolve
(or resolve to the wrong network): export it in the batch script, e.g. hydra.launcher.setup."""
ROLL_CALL = "currytrain/rank"
RECORD_KEY = "currytrain/record"
_store: Any = None
"""This job's TCPStore (rank 0 hosts it), kept for the life of the process: torch's env:// rendezvous shares
it (same address and port, multi-tenant), and the other ranks learn through it that rank 0 went away."""


def join_submitit_job(rendezvous_timeout: float) -> int:
    """Set the env:// rendezvous variables torch.distributed reads from submitit's view of the job, check that
    every rank can reach rank 0 within `rendezvous_timeout` seconds (parallel.rendezvous_timeout), and return
    this task's rank. Tasks of one job share its id, so the port (derived from it) agrees without talking."""
    import submitit

    global _store
    job = submitit.JobEnvironment()
    port = 20000 + int.from_bytes(job.job_id.encode()[-8:].rjust(8, b"0"), "little") % 20000
    master = master_address(job.hostnames[0], os.environ.get("SLURM_JOB_NODELIST", ""))
    os.environ.update(
        RANK=str(job.global_rank),
        WORLD_SIZE=str(job.num_tasks),
        LOCAL_RANK=str(job.local_rank),
        LOCAL_WORLD_SIZE=str(job.num_tasks // job.num_nodes),
        MASTER_ADDR=master,
        MASTER_PORT=str(port),
    )
    log.info(
        "job %s: rank %d of %d (node %d of %d, %s); master %s:%d",
        job.job_id,
        job.global_rank,
        job.num_tasks,
        job.node,
        job.num_nodes,
        job.hostname,
        master,
        port,
    )
    _store = roll_call(master, port, job.global_rank, job.num_tasks, rendezvous_timeout)
    return job.global_rank


def master_address(first_node: str, nodelist: str) -> str:
    """Where rank 0 listens: the job's first node by name, else by the address slurm.conf gives it (NodeAddr,
    from scontrol), or CURRYTRAIN_MASTER_ADDR when set. A ConfigError when none of them resolves here."""
    explicit = os.environ.get(MASTER_ADDR_ENV)
    if explicit:
        if slurm.resolves(explicit):
            return explicit
        raise ConfigError(
            f"{MASTER_ADDR_ENV}={explicit} does not resolve on {socket.gethostname()}: export an address of the job's first node there, or unset it"
        )
    if slurm.resolves(first_node):
        return first_node
    address = slurm.node_address(first_node)
    if address and slurm.resolves(address):
        log.info("the node name %s does not resolve here; using its NodeAddr %s (scontrol show node %s)", first_node, address, first_node)
        return address
    raise ConfigError(
        f"the master address {first_node} (the first node of SLURM_JOB_NODELIST={nodelist or '?'}) does not resolve on "
        f"{socket.gethostname()}, and scontrol gives no address for it: make the node names resolve on every node (DNS "
        f"or /etc/hosts), or export {MASTER_ADDR_ENV}=<an address of that node> in the batch script (hydra.launcher.setup)"
    )


def roll_call(address: str, port: int, rank: int, world_size: int, timeout: float) -> Any:
    """Every rank joins rank 0's TCPStore and waits until all `world_size` have; after `timeout` seconds a
    RunFailed names the address, the ranks seen and the fix, instead of torch retrying for half an hour."""
    import torch.distributed as dist

    where, wait = f"{address}:{port}", timedelta(seconds=timeout)
    fix = (
        f"check that the job's nodes reach {where} (a firewall, or a node name that resolves to another network: "
        f"export {MASTER_ADDR_ENV}), that every task started (each one's log under the multirun's .submitit/), "
        f"or give slow starts more time with parallel.rendezvous_timeout"
    )
    try:
        store = dist.TCPStore(address, port, is_master=rank == 0, timeout=wait, multi_tenant=True, wait_for_workers=False)
    except Exception as error:  # DistNetworkError, a timeout, the port taken
        reason = str(error).splitlines()[0].rstrip(".") if str(error) else type(error).__name__
        raise RunFailed(
            f"rank {rank} of {world_size} could not reach the rendezvous at {where} (rank 0) within parallel.rendezvous_timeout={timeout:g} s: {reason}. Fix: {fix}"
        ) from None
    store.set(f"{ROLL_CALL}/{rank}", socket.gethostname())
    try:
        store.wait([f"{ROLL_CALL}/{r}" for r in range(world_size)], wait)
    except Exception as error:
        seen = {r: store.get(f"{ROLL_CALL}/{r}").decode() for r in range(world_size) if store.check([f"{ROLL_CALL}/{r}"])}
        missing = [r for r in range(world_size) if r not in seen]
        ranks = ", ".join(f"{r} ({host})" for r, host in sorted(seen.items()))
        raise RunFailed(
            f"the rendezvous at {where} did not form within parallel.rendezvous_timeout={timeout:g} s: ranks seen {ranks or 'none'}; "
            f"missing {missing} of {world_size} ({str(error).splitlines()[0]}). Fix: {fix}"
        ) from None
    return store


def record_ready(run_dir: Path) -> Path:
    """The marker rank 0 writes once this launch's run record is complete (one per job: a relaunch into the
    same folder must not find the previous one)."""
    import submitit

    return Path(run_dir) / WORKERS_DIR / f"record_ready.{submitit.JobEnvironment().job_id}"


def mark_record_ready(run_dir: Path) -> None:
    marker = record_ready(run_dir)
    marker.parent.mkdir(exist_ok=True)
    marker.touch()
    if _store is not None:
        _store.set(RECORD_KEY, str(run_dir))


def wait_for_record(run_dir: Path) -> None:
    """A rank > 0: wait for rank 0's run record. Through the job's store, when rank 0's process ends first (its
    config was rejected, it crashed) this rank learns it at once instead of after RUN_DIR_WAIT."""
    if _store is not None:
        try:
            _store.wait([RECORD_KEY], RUN_DIR_WAIT)
        except Exception as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise RunFailed(f"rank 0 ended (or went silent) before it wrote the run record into {run_dir}: {reason}. Rank 0's log says why") from None
        return
    marker, deadline = record_ready(run_dir), time.monotonic() + RUN_DIR_WAIT.total_seconds()
    while not marker.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank 0 wrote no run record into {run_dir} within {RUN_DIR_WAIT}")
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------- torchrun


def _agent_store() -> Any:
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=RUN_DIR_WAIT)


def _run_dir_key() -> str:
    return f"currytrain/run_dir/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def publish_run_dir(run_dir: Path) -> None:
    """Rank 0, once the run record is written: tell the other ranks where it is."""
    _agent_store().set(_run_dir_key(), str(Path(run_dir).resolve()))


def follow_rank_zero(entry: WorkerEntry) -> int:
    """A torchrun rank other than 0: wait for rank 0's run folder, train from its resolved.yaml, and
    return this process's exit code (the outcome's, 1 for a crash). `entry` is the job (run.run_worker)."""
    run_dir = Path(_agent_store().get(_run_dir_key()).decode())
    try:
        entry(run_dir / RESOLVED)
    except Outcome as outcome:
        print(outcome, file=sys.stderr)
        return outcome.exit_code
    except Exception:
        traceback.print_exc()
        return 1
    return 0
