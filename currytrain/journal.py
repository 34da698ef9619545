"""The run journal (journal.jsonl): a header that makes the run reproducible, then one line per event.

Header: seed, git SHA and dirty flag (the dirty diff goes to git.diff beside it), package versions,
world size, host, the overrides and the config's difference from the defaults. Events: launch (a relaunch
into the same folder), start, metrics, eval, checkpoint, resume, restart (from step 0: nothing to resume), init_from,
skip_step, rollback, finish, and how a run that did not finish ended: config_error, abort, pruned, or failure (with
the traceback).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import platform
import shlex
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from currytrain.diskio import append_line, write_failure_cause
from currytrain.errors import RunFailed

TRACKED_PACKAGES = ("currytrain", "torch", "hydra-core", "omegaconf", "numpy", "tensorboard", "rich")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


GIT_QUERIES = {
    "sha": ("rev-parse", "HEAD"),
    "diff": ("diff", "--no-ext-diff", "--no-textconv", "HEAD"),
    "untracked": ("ls-files", "--others", "--exclude-standard"),
}
"""The only git commands the journal runs: fixed arguments, none from a config (git's aliases and -c options would
turn chosen arguments into a shell command), no external diff or text-conversion program."""


def _git(cwd: Path, query: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(cwd), *GIT_QUERIES[query]], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state(cwd: Path) -> dict[str, Any]:
    """SHA of HEAD, whether the tree differs from it (untracked files count: a new experiments/ file is
    code too), the diff of tracked files and the untracked files' names. None outside a repository."""
    sha = _git(cwd, "sha")
    if sha is None:
        return {"sha": None, "dirty": None, "diff": None, "untracked": None}
    diff = _git(cwd, "diff") or ""
    untracked = (_git(cwd, "untracked") or "").split()
    return {"sha": sha.strip(), "dirty": bool(diff or untracked), "diff": diff, "untracked": untracked}


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def config_diff(config: dict, defaults: dict) -> dict[str, dict[str, Any]]:
    """Keys whose value differs from the default config: {key: {"default": d, "value": v}}."""
    ours, base = flatten(config), flatten(defaults)
    return {key: {"default": base.get(key), "value": ours.get(key)} for key in sorted(set(ours) | set(base)) if ours.get(key) != base.get(key)}


class Journal:
    """Append-only JSONL file, written in whole lines (a failed write leaves none behind); only the main rank writes."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled

    def _write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            append_line(self.path, json.dumps(record, default=str))
        except OSError as error:
            cause = write_failure_cause(error, self.path.parent)
            if cause is None:
                raise
            raise RunFailed(
                f"could not append to the journal {self.path}: {cause}. Free space (or make the folder writable), then continue with trainer.resume=auto"
            ) from error

    def header(self, *, seed: int, world_size: int, overrides: list[str], diff: dict, cwd: Path) -> None:
        """The first line of a new journal; a relaunch into the same folder appends a `launch` event instead."""
        git = git_state(cwd)
        if git["diff"] and self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            (self.path.parent / "git.diff").write_text(git["diff"])
        record = {
            "type": "header" if not self.path.exists() else "launch",
            "time": _now(),
            "seed": seed,
            "git_sha": git["sha"],
            "git_dirty": git["dirty"],
            "git_untracked": git["untracked"],
            "versions": package_versions(),
            "world_size": world_size,
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "argv": sys.argv,
            "overrides": overrides,
            "config_diff": diff,
        }
        self._write(record)

    def event(self, kind: str, **fields: Any) -> None:
        self._write({"type": kind, "time": _now(), **fields})


RESUME_KEYS = ("hydra.run.dir", "trainer.resume")
"""The overrides resume_command sets itself."""


def resume_command(run_dir: Path) -> str:
    """The command that continues the run in `run_dir` from its newest complete checkpoint, in the same folder: the
    overrides it was launched with (its journal's header), then hydra.run.dir=<run_dir> trainer.resume=auto."""
    path = Path(run_dir) / "journal.jsonl"
    try:
        header = next((r for r in read_journal(path) if r.get("type") == "header"), {}) if path.is_file() else {}
    except (OSError, ValueError):
        header = {}
    kept = [o for o in header.get("overrides") or [] if o.partition("=")[0].lstrip("+~") not in RESUME_KEYS]
    return shlex.join(["python", "launch.py", *kept, f"hydra.run.dir={Path(run_dir).resolve()}", "trainer.resume=auto"])


class Records(list):
    """A journal's records, with the lines a reader passed over (`skipped`: "line N: why")."""

    def __init__(self, records: list[dict], skipped: list[str]):
        super().__init__(records)
        self.skipped = skipped


NUMERIC_RECORDS = ("metrics", "eval", "finish")
"""Records whose fields (type and time aside) are numbers: the curves and final values readers compute with."""
TEXT_FIELDS = ("message", "error", "traceback", "path", "problem", "reason", "signal", "checkpoint", "git_sha")
"""Fields that are text in every record that has them."""
TORN = '{"type": '
"""How every record starts (json.dumps of a dict whose first key is type): where a record glued onto a torn line begins."""


def record_problem(record: Any) -> str | None:
    """Why a parsed line is not a journal record readers can use, or None."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a record"
    if not isinstance(record.get("type"), str):
        return "no type"
    if "step" in record and (not isinstance(record["step"], int) or isinstance(record["step"], bool)):
        return f"its step {record['step']!r} is not a whole number"
    if "time" in record:
        try:
            dt.datetime.fromisoformat(record["time"])
        except (TypeError, ValueError):
            return f"its time {str(record['time'])[:40]!r} is not an ISO timestamp"
    for key in TEXT_FIELDS:
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"its {key} is a {type(record[key]).__name__}, not text"
    if record["type"] in NUMERIC_RECORDS:
        for key, value in record.items():
            if key not in ("type", "time") and (not isinstance(value, int | float) or isinstance(value, bool)):
                return f"its {key} {str(value)[:40]!r} is not a number"
    return None


def read_journal(path: Path) -> Records:
    """Every usable record of a journal, and the lines passed over. A line that is not a record is skipped and named
    (its number and why): a last line cut short by a kill, a torn line a power cut left with the next launch's
    record glued on (that record is recovered), bytes changed by hand."""
    records, skipped = [], []
    lines = Path(path).read_bytes().decode("utf-8", errors="replace").split("\n")  # only \n ends a record (not \x1e, \x85, ...)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record, problem = _parse(line)
        if problem is None:
            records.append(record)
            continue
        glued = line.rfind(TORN)
        if glued > 0 and (tail := _parse(line[glued:]))[1] is None:
            records.append(tail[0])
            problem = f"{problem}; the record after its torn start was recovered"
        skipped.append(f"line {number}: {problem}")
    return Records(records, skipped)


def _parse(line: str) -> tuple[Any, str | None]:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as error:
        return None, f"not JSON ({str(error)[:80]})"
    return record, record_problem(record)


RESTARTS = ("resume", "rollback", "restart")
"""Events after which a run re-runs the steps past the checkpoint it loaded (the event's step)."""
CURVES = ("metrics", "eval", "evaluation")


def superseded(records: list[dict]) -> set[int]:
    """Indexes of the metrics and eval records a later resume or rollback re-ran: a record of step s is
    superseded when a later restart went back to a checkpoint before s (the re-run's values win)."""
    limit, stale = math.inf, set()
    for index in range(len(records) - 1, -1, -1):
        record = records[index]
        kind, step = record.get("type"), record.get("step")
        if not isinstance(step, int):
            continue
        if kind in RESTARTS:
            limit = min(limit, step)
        elif kind in CURVES and step > limit:
            stale.add(index)
    return stale


def current(records: list[dict]) -> list[dict]:
    """The records with each step's metrics and eval once, as the run stands: the values of the last
    segment that ran the step (steps re-run after a resume or rollback appear once)."""
    stale = superseded(records)
    return [record for index, record in enumerate(records) if index not in stale]


def timeline(records: list[dict]) -> list[str]:
    """A readable account of a journal: one line per event, runs of `metrics` folded into one line (which
    says how many of them a later resume re-ran: the curves keep the re-run's values)."""
    lines: list[str] = []
    start = None
    metrics: list[dict] = []
    stale = superseded(records)
    rerun = 0

    def flush() -> None:
        nonlocal rerun
        if metrics:
            first, last = metrics[0], metrics[-1]
            note = f", {rerun} re-run later" if rerun else ""
            lines.append(
                f"{'':>9}  metrics   steps {first['step']}-{last['step']} ({len(metrics)} records{note}), train loss {first.get('train/loss', float('nan')):.4f} -> {last.get('train/loss', float('nan')):.4f}"
            )
            metrics.clear()
            rerun = 0

    for index, record in enumerate(records):
        kind = record.get("type", "?")
        if kind == "metrics":
            metrics.append(record)
            rerun += index in stale
            continue
        flush()
        when = dt.datetime.fromisoformat(record["time"]) if "time" in record else None
        if kind in ("header", "launch"):
            start = when
            git = f"git {str(record.get('git_sha'))[:10]}{' (dirty)' if record.get('git_dirty') else ''}"
            lines.append(
                f"{str(record.get('time', '?'))[:19]:<19}  {kind:<9} seed {record.get('seed')}, {git}, world {record.get('world_size')}, overrides {record.get('overrides')}"
            )
            continue
        offset = f"+{(when - start).total_seconds():.1f}s" if when and start else ""
        details = ", ".join(f"{key} {_short(value)}" for key, value in record.items() if key not in ("type", "time", "traceback"))
        lines.append(f"{offset:>9}  {kind:<9} {details}")
    flush()
    return lines + [f"skipped {line}" for line in getattr(records, "skipped", [])]


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."
