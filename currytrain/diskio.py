"""Writes that fail cleanly: journal lines appended whole or not at all, and a failed write explained by
its cause (a full disk, a read-only or forbidden folder) instead of the library error that surfaced it.
Imports no torch: the journal uses it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

STORAGE_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "writing is not permitted",
    errno.EPERM: "writing is not permitted",
}


def append_line(path: Path, line: str) -> None:
    """Append one line in a single write; if the write fails, cut the file back to its old size, so a
    reader never finds half a line left by a full disk. A file whose last line was cut short (a power cut
    mid-write) gets a line break first, so the new line is not glued onto the torn one."""
    data = (line + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def os_error_in(error: BaseException) -> OSError | None:
    """The storage OSError behind `error`: itself, its causes, or the per-rank failures DCP wraps."""
    seen: set[int] = set()
    stack = [error]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
            return current
        stack += [current.__cause__, current.__context__]
        stack += [failure[0] for failure in getattr(current, "failures", {}).values() if isinstance(failure, tuple)]
    return None


def storage_failure(error: BaseException) -> Exception | None:
    """A RunFailed saying which write failed and why, when a storage error ended the run where no one
    explained it (a logger's file, a library's cache); None otherwise."""
    from currytrain.errors import Outcome, RunFailed

    found = None if isinstance(error, Outcome) else os_error_in(error)
    if found is None:
        return None
    where = f" to {found.filename}" if found.filename else ""
    return RunFailed(
        f"a write{where} failed: {STORAGE_ERRNOS[found.errno]}. Free space (or make the folder writable), then continue with "
        "trainer.resume=auto; the checkpoints saved before are intact"
    )


def write_failure_cause(error: BaseException, folder: Path) -> str | None:
    """Why a write into `folder` failed, in words ("the disk is full (/x: 12 KiB free)"), or None when the
    storage is not the cause. Some writers hide the OSError (torch's zip writer reports a position
    mismatch), so when none is found the folder is probed with a small write."""
    found = os_error_in(error)
    if found is None:
        found = _probe(folder)
    if found is None:
        return None
    return f"{STORAGE_ERRNOS[found.errno]} ({_free(folder)})"


def _probe(folder: Path) -> OSError | None:
    probe = Path(folder) / ".write_probe"
    try:
        with probe.open("wb") as handle:
            handle.write(b"\0" * 65536)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        return error if error.errno in STORAGE_ERRNOS else None
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
    return None


def _free(folder: Path) -> str:
    import shutil

    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return f"{folder}"
    return f"{folder}: {free / 1024:.0f} KiB free"
