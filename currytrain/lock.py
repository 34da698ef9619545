"""The run-folder lock: one process at a time writes a run folder.

A run, a sweep trial, a ladder and a resume hold <run>/run.lock while they write the folder. The lock is an
flock(2) on that file (the kernel drops it when its process dies, however it dies) plus, inside the file, who
holds it: pid, host, start time, command, the SLURM job and a heartbeat rewritten every HEARTBEAT_S seconds. A
second process that would write the folder is refused with that description and exits 2 (ConfigError).

A lock whose holder is dead is taken over, and the caller journals it (RunLock.took_over):
- on the same host, when the flock is free (its process died) or, where the file system has no flock, when the
  holder's pid no longer runs that process;
- on another host (a shared file system, where the flock may not reach), when its heartbeat is older than STALE_S;
- a requeued SLURM job (the same SLURM_JOB_ID on another node, a new pid) takes over its own earlier incarnation.

Only the process that runs the job locks: torchrun's rank 0, the task of rank 0 of a submitit job, the launcher of
parallel.nproc workers; one lock per run, not per rank. Readers (journal, compare, diagnose, report) never lock.
Imports no torch and no Hydra.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from currytrain.errors import ConfigError

LOCK_FILE = "run.lock"
HEARTBEAT_S = 10.0
"""How often a holder rewrites its heartbeat (seconds)."""
STALE_S = 90.0
"""A holder on another host whose heartbeat is older than this (seconds) is taken to be dead."""
NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
"""flock(2) errors of file systems that do not offer it (some FUSE and parallel file systems)."""

try:
    import fcntl
except ImportError:  # Windows: the holder's description alone decides
    fcntl = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Holder:
    """Who holds a run folder, as written into its lock file."""

    pid: int
    host: str
    started: str
    """When the holder took the lock (UTC, ISO 8601)."""
    command: str
    heartbeat: float
    """time.time() of the holder's last heartbeat."""
    proc_start: str | None = None
    """The process's start time in clock ticks since boot (Linux /proc): a pid reused by another process differs."""
    job: str | None = None
    """The SLURM job (SLURM_JOB_ID, with the array task) the holder ran in: a requeued job keeps it."""

    def describe(self) -> str:
        job = f", SLURM job {self.job}" if self.job else ""
        return f"pid {self.pid} on {self.host}{job}, started {self.started}: {self.command}"

    @staticmethod
    def parse(text: str) -> Holder | None:
        try:
            fields = json.loads(text)
            return Holder(**{key: fields.get(key) for key in Holder.__dataclass_fields__})
        except (ValueError, TypeError, AttributeError):
            return None


def _proc_start(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in ticks since boot), or None where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _job_id() -> str | None:
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{job}_{task}" if job and task and "SLURM_ARRAY_JOB_ID" in os.environ else job


def me(heartbeat: float | None = None) -> Holder:
    return Holder(
        pid=os.getpid(),
        host=socket.gethostname(),
        started=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        command=shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else sys.executable,
        heartbeat=round(heartbeat or time.time(), 1),
        proc_start=_proc_start(os.getpid()),
        job=_job_id(),
    )


def pid_alive(holder: Holder) -> bool:
    """Whether the holder's process still runs on this host (a reused pid does not count)."""
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        pass
    now = _proc_start(holder.pid)
    return holder.proc_start is None or now is None or now == holder.proc_start


def stale_reason(holder: Holder, flock_free: bool | None) -> str | None:
    """Why `holder` no longer holds the folder (so it may be taken over), or None while it may still hold it.

    flock_free: True when this process could take the flock (no live process on a host sharing the lock
    holds it), None when the file system has no flock."""
    mine = me()
    if holder.job and holder.job == mine.job and (holder.pid, holder.host) != (mine.pid, mine.host):
        return f"the holder was an earlier run of this SLURM job {holder.job} (requeued)"
    if holder.host == mine.host:
        if flock_free or not pid_alive(holder):
            return f"its holder (pid {holder.pid}) is no longer running"
        return None
    age = time.time() - float(holder.heartbeat or 0)
    if age > STALE_S:
        return f"its holder on {holder.host} has not renewed its heartbeat for {age:.0f} s (more than {STALE_S:.0f} s)"
    return None


def held_message(run_dir: Path, holder: Holder | None) -> str:
    who = holder.describe() if holder else "another process (its description is being written)"
    return (
        f"the run folder {run_dir} is in use by {who}: choose another run folder (hydra.run.dir=<new folder>, or "
        f"hydra.sweep.dir for -m), or wait until that run ends (trainer.resume=auto then continues it)"
    )


def _read_holder(path: Path) -> Holder | None:
    """The holder written in a lock file; a rewrite in progress is read again."""
    for _ in range(5):
        try:
            text = path.read_text()
        except OSError:
            return None
        if not text.strip():
            return None
        holder = Holder.parse(text)
        if holder is not None:
            return holder
        time.sleep(0.01)
    return None


def _try_flock(fd: int, tries: int = 1, shared: bool = False) -> bool | None:
    """True when this fd took the exclusive flock, False when another holds it, None without flock support.
    With tries > 1 a busy flock is tried again over a few tens of milliseconds: another process's look at the
    lock (held_by_another) holds it for microseconds, a run for its whole length."""
    if fcntl is None:
        return None
    for attempt in range(tries):
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < tries:
                time.sleep(0.02)
        except OSError as error:
            if error.errno in NO_FLOCK:
                return None
            raise
    return False


class RunLock:
    """A held run folder. release() (or leaving the `with` block) gives it up; nested acquires of the same
    folder by the same process share it."""

    def __init__(self, run_dir: Path, fd: int, took_over: dict[str, Any] | None, path: Path | None = None):
        self.run_dir, self.path, self.fd = run_dir, path or run_dir / LOCK_FILE, fd
        self.took_over = took_over
        """The stale holder and why it was taken over (the caller journals it), or None."""
        self.holder = me()
        self.count = 1
        self._stop = threading.Event()
        self._write(self.holder)
        self._beat = threading.Thread(target=self._heartbeat, name=f"run-lock {run_dir.name}", daemon=True)
        self._beat.start()

    def _write(self, holder: Holder | None) -> None:
        data = (json.dumps(asdict(holder)) if holder else "").encode()
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):  # a full disk must not kill the run over a heartbeat
                self.holder = Holder(**{**asdict(self.holder), "heartbeat": round(time.time(), 1)})
                self._write(self.holder)

    def release(self) -> None:
        self.count -= 1
        if self.count > 0:
            return
        _HELD.pop(self.path.resolve(), None)
        self._stop.set()
        self._beat.join(timeout=5)
        with contextlib.suppress(OSError):
            self._write(None)  # the file stays (removing it would race a process opening it); empty is free
        with contextlib.suppress(OSError):
            if fcntl is not None:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_HELD: dict[Path, RunLock] = {}
"""The folders this process holds, by resolved lock path."""


def holding(run_dir: str | Path) -> RunLock | None:
    return _HELD.get((Path(run_dir) / LOCK_FILE).resolve())


def acquire(run_dir: str | Path) -> RunLock:
    """Hold `run_dir` (created if missing), or raise ConfigError naming its live holder and the fix."""
    run_dir = Path(run_dir)
    if (held := holding(run_dir)) is not None:
        held.count += 1
        return held
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        flocked = _try_flock(fd, tries=3)
        holder = _read_holder(path)
        if flocked is False:
            raise ConfigError(held_message(run_dir, holder))
        took_over = None
        if holder is not None:
            reason = stale_reason(holder, flocked)
            if reason is None:
                raise ConfigError(held_message(run_dir, holder))
            took_over = {"previous": asdict(holder), "reason": reason}
    except BaseException:
        os.close(fd)  # closing drops a flock this fd took
        raise
    lock = RunLock(run_dir, fd, took_over)
    _HELD[path.resolve()] = lock
    return lock


def try_hold(path: Path) -> RunLock | Holder | None:
    """Hold the lock file `path` now (a dead holder's is taken over), or return who holds it: its Holder, or None
    while the holder is still writing its description. For what one process does for many at once (a token
    cache being prepared: currytrain/data/prepare.py); a run folder's lock is acquire()'s."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        flocked = _try_flock(fd)
        holder = _read_holder(path)
        reason = stale_reason(holder, flocked) if holder is not None and flocked is not False else None
        if flocked is False or (holder is not None and reason is None):
            os.close(fd)  # closing drops a flock this fd took
            return holder
    except BaseException:
        os.close(fd)
        raise
    return RunLock(path.parent, fd, {"previous": asdict(holder), "reason": reason} if holder else None, path=path)


def held_by_another(run_dir: str | Path) -> str | None:
    """Why `run_dir` cannot be written now (it is held by a live process other than this one), or None.
    Writes nothing: validation asks before any folder exists."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_FILE
    if holding(run_dir) is not None or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        flocked = _try_flock(fd, shared=True)  # a shared look: it keeps no acquirer out for long
        holder = _read_holder(path)
        if flocked is False:
            return held_message(run_dir, holder)
        if holder is not None and stale_reason(holder, flocked) is None:
            return held_message(run_dir, holder)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """A blocking flock on `path` (created if missing) for a short critical section shared by processes of
    this host (a sweep's count-and-ask on its study); without flock support the section is not exclusive."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as error:
                if error.errno not in NO_FLOCK:
                    raise
        yield
    finally:
        os.close(fd)
