"""SLURM asked through its own commands, without submitit or torch: the state of jobs (squeue, which needs no
accounting database, unlike sacct), the address slurm.conf gives a node (scontrol), a requeue, and the record
of a multirun's jobs (JOBS_RECORD in its folder) that the launcher appends to and `currytrain diagnose` reads.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

JOBS_RECORD = "slurm_jobs.jsonl"
"""In a multirun folder: one line per submitted job and per change of its state (the launcher writes it)."""
GONE = "GONE"
"""The state of a job the controller no longer knows (it forgets ended jobs MinJobAge seconds after they end)."""
TERMINAL = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT", GONE})
FIELDS = ("JobArrayID", "State", "NodeList", "Reason", "exit_code", "RestartCnt")
COMMAND_TIMEOUT = 30.0
"""Seconds a SLURM command may take before it counts as unanswered (a controller under load answers in ms)."""


def sbatch() -> str | None:
    """Where sbatch is, or None on a machine without SLURM's client commands."""
    return shutil.which("sbatch")


@dataclass(frozen=True)
class JobState:
    """One job (or array task, `12_3`) as squeue shows it."""

    state: str
    nodes: str = ""
    reason: str = ""
    exit_code: str = ""
    restarts: int = 0

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    def describe(self) -> str:
        """PENDING (Resources), RUNNING on n[1-2], FAILED (exit code 1), ... and how often it was requeued."""
        if self.state == "PENDING" and self.reason not in ("", "None"):
            text = f"PENDING ({self.reason})"
        elif self.state == "RUNNING" and self.nodes:
            text = f"RUNNING on {self.nodes}"
        elif self.state == GONE:
            text = "ended (the controller no longer lists it)"
        elif self.finished and self.exit_code not in ("", "0"):
            text = f"{self.state} ({exit_status(self.exit_code)})"
        else:
            text = self.state
        return text + (f", requeued {self.restarts}x" if self.restarts else "")


def exit_status(raw: str) -> str:
    """squeue's exit_code is the wait status: the exit code times 256, or the signal that ended the batch script."""
    if not raw.isdigit():
        return f"exit code {raw}"
    status = int(raw)
    return f"exit code {status >> 8}" if status >= 256 else f"killed by signal {status}"


def job_states(job_ids: Iterable[str]) -> dict[str, JobState] | None:
    """The controller's view of these jobs; None when it could not be asked (squeue missing or failing)."""
    ids = sorted({str(job_id) for job_id in job_ids})
    if not ids:
        return {}
    command = ["squeue", "-h", "-r", "--states=all", "-j", ",".join(ids), "-O", ",".join(f"{name}:|" for name in FIELDS)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        # Every id asked for is forgotten: squeue refuses the lot (one known id among them lists that one).
        return {job_id: JobState(GONE) for job_id in ids} if "Invalid job id" in result.stderr else None
    states = {}
    for line in result.stdout.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) >= len(FIELDS):
            job_id, state, nodes, reason, exit_code, restarts = parts[: len(FIELDS)]
            states[job_id] = JobState(state, nodes, reason, exit_code, int(restarts) if restarts.isdigit() else 0)
    return {job_id: states.get(job_id, JobState(GONE)) for job_id in ids}


def node_address(node: str) -> str | None:
    """The address slurm.conf gives `node` (its NodeAddr, which may differ from its name), from scontrol; None
    when scontrol cannot tell."""
    try:
        result = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\bNodeAddr=(\S+)", result.stdout)
    return match.group(1) if result.returncode == 0 and match else None


def resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def requeue(job_id: str) -> str | None:
    """Put a running job back in the queue (SLURM stops its processes, then starts the batch script again);
    the error SLURM gave, or None when it did."""
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    return None if result.returncode == 0 else (result.stderr or result.stdout).strip()


# ------------------------------------------------------------------------------------ a multirun's jobs


@dataclass
class JobRecord:
    """A job of a multirun as the launcher last saw it."""

    job_id: str
    job_num: int
    """Hydra's job number: the run folder is <multirun>/<job_num> (its subdir by default)."""
    label: str
    state: str
    description: str
    tasks: int
    logs: list[str]
    """Each task's stderr, then stdout, in task order: <multirun>/.submitit/<job>/<job>_<task>_log.{err,out}."""
    time: str = ""


def append_record(folder: Path, record: JobRecord) -> None:
    record.time = dt.datetime.now().isoformat(timespec="seconds")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / JOBS_RECORD, "a") as out:
        out.write(json.dumps(asdict(record)) + "\n")


def read_records(folder: Path) -> dict[str, JobRecord]:
    """The latest record of each job in a multirun folder, in submission order."""
    path = Path(folder) / JOBS_RECORD
    records: dict[str, JobRecord] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                record = JobRecord(**json.loads(line))
                records[record.job_id] = record
    return records


def stderr_tail(path: Path, lines: int = 12) -> list[str]:
    """The last lines of a task's stderr, without torch's C++ stack frames (which drown the Python error)."""
    if not Path(path).is_file():
        return []
    kept = [line for line in Path(path).read_text(errors="replace").splitlines() if line.strip() and not _native_frame(line)]
    return kept[-lines:]


def _native_frame(line: str) -> bool:
    return bool(re.match(r"^(frame #\d+:|Exception raised from |<omitting python frames>)", line.strip()))
