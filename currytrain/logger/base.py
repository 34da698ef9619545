"""The logger protocol the trainer talks to, a fan-out over several backends, and what they share.

Every backend takes scalars, the resolved config and text; histograms go to the backends that can show
them (TensorBoard, W&B, Aim) and the others ignore them. Only rank 0 builds loggers. A run that belongs to a
group (a sweep's trial, a multirun's job, a ladder's sub-run) says so in its journal (RunGroup), which
each backend reads to group, nest and tag it.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from currytrain.errors import Aborted, Interrupted, Pruned
from currytrain.journal import Journal


@runtime_checkable
class Logger(Protocol):
    """What every tracking backend implements. Backends are built with run_dir as a runtime argument."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_config(self, config: Mapping) -> None: ...

    def log_text(self, name: str, text: str, step: int = 0) -> None: ...

    def log_histogram(self, name: str, values: Any, step: int) -> None: ...

    def close(self, status: str = "finished") -> None:
        """status: finished, pruned (a sweep's pruner stopped it), aborted (an abort condition), interrupted
        (a signal, after a checkpoint) or failed (anything else); see ending_status."""
        ...


@runtime_checkable
class Restartable(Protocol):
    """A backend that can forget what it logged after a step: a resumed (or rolled-back) run re-runs the
    steps past its checkpoint, and the re-run's values must replace the earlier ones, not join them."""

    def restarted(self, step: int) -> None: ...


QUEUE_CALLS = 4096
"""Calls waiting for the deferred backends at most: a backend slower than training slows it down rather than
filling memory."""


class MultiLogger:
    """Forwards every call to each backend. Backends marked `deferred = True` (TensorBoard, MLflow, W&B) are
    called from one logging thread, in order, so that a run logging every step does not wait for their
    serialization and stores; the others (jsonl, and every logger of a project or a test) are called at once,
    in the training loop. close() drains the thread; an error a deferred backend raised is raised at the next
    call or at close. What a killed run had queued for the deferred backends is lost; the journal and jsonl keep it."""

    def __init__(self, loggers: list[Logger]):
        self.loggers = loggers
        self.now = [logger for logger in loggers if not getattr(logger, "deferred", False)]
        self.later = [logger for logger in loggers if getattr(logger, "deferred", False)]
        self.error: BaseException | None = None
        self.queue: queue.Queue | None = None
        if self.later:
            self.queue = queue.Queue(maxsize=QUEUE_CALLS)
            self.thread = threading.Thread(target=self._work, name="currytrain-loggers", daemon=True)
            self.thread.start()

    def _work(self) -> None:
        assert self.queue is not None
        while (call := self.queue.get()) is not None:
            method, args = call
            for logger in self.later:
                try:
                    if method == "restarted":
                        if isinstance(logger, Restartable):
                            logger.restarted(*args)
                    else:
                        getattr(logger, method)(*args)
                except Exception as error:  # the training thread raises it at its next call
                    self.error = self.error or error

    def _call(self, method: str, *args: Any) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        for logger in self.now:
            getattr(logger, method)(*args)
        if self.queue is not None:
            self.queue.put((method, args))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._call("log_metrics", dict(metrics), step)  # a copy: the trainer adds to its dict after logging it

    def log_config(self, config: Mapping) -> None:
        self._call("log_config", config)

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        self._call("log_text", name, text, step)

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        self._call("log_histogram", name, values.clone() if hasattr(values, "clone") else values, step)

    def restarted(self, step: int) -> None:
        """The run continues from a checkpoint of `step`: the backends that can drop what they logged after it."""
        for logger in self.now:
            if isinstance(logger, Restartable):
                logger.restarted(step)
        if self.queue is not None:
            self.queue.put(("restarted", (step,)))

    def close(self, status: str = "finished") -> None:
        try:
            for logger in self.now:
                logger.close(status)
        finally:
            if self.queue is not None:
                self.queue.put(("close", (status,)))
                self.queue.put(None)
                self.thread.join()
                self.queue = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def journal_header(run_dir: str | Path) -> dict[str, Any]:
    """The first record of the run's journal (its header), or {} when there is none yet."""
    journal = Path(run_dir) / "journal.jsonl"
    if not journal.is_file():
        return {}
    with journal.open() as file:
        return json.loads(file.readline() or "{}")


def journal_tags(run_dir: Path) -> dict[str, str]:
    """The journal header's reproducibility facts (git SHA, dirty flag, seed, host, versions) as tags."""
    header = journal_header(run_dir)
    keys = ("seed", "git_sha", "git_dirty", "host", "world_size")
    tags = {f"currytrain.{key}": str(header.get(key)) for key in keys if key in header}
    tags.update({f"currytrain.version.{name}": str(version) for name, version in header.get("versions", {}).items()})
    return tags


# ------------------------------------------------------------------ runs among others: sweeps, multiruns, ladders

GROUP_EVENT = "group"
"""The journal event, written right after the header, that says which group a run belongs to."""
ENDINGS = ("finished", "pruned", "aborted", "interrupted", "failed")
"""The statuses close() receives (ending_status maps a raised outcome to one)."""


@dataclass(frozen=True)
class RunGroup:
    """Where a run stands among others: a trial of a sweep, a job of a multirun (`-m seed=1,2,3`), a sub-run of
    a ladder, or the ladder run itself, the parent of its sub-runs. Whoever starts the run writes it to the
    run's journal (record_group); each backend reads it (read_group) to group, nest and tag the run.

    The group's parent in a tracker is the run whose folder is `folder`: the ladder's own run, or, for a sweep,
    a run the first member creates (MLflow's parent run)."""

    kind: str
    """sweep (an Optuna study), multirun (Hydra's own sweeper), or ladder."""
    name: str
    """The group's name in the trackers: W&B's group, Aim's experiment, the MLflow parent run's name."""
    folder: str
    """The group's folder (the sweep's, the ladder run's), absolute: what identifies the parent."""
    stores: str
    """The folder beside which the group's default stores lie (mlflow.db, .aim), shared by all its members."""
    member: str = ""
    """This run in the group (the trial's number, the job's number, the sub-run's <stage>/<name>); empty for the
    parent itself."""
    job_type: str = ""
    """W&B's job_type: trial, job, the ladder stage of a sub-run, ladder for the ladder's own run."""
    stage: str = ""
    """The ladder stage of a sub-run."""
    role: str = ""
    """What the member is: trial, job, or the sub-run's name in its stage (baseline_seed_0, dim_64, ...)."""
    params: dict[str, Any] = field(default_factory=dict)
    """What sets this member apart, by override key: the sampled values, the swept overrides, the sub-run's
    overrides. Values are numbers, strings, booleans or None."""
    tags: dict[str, str] = field(default_factory=dict)
    """More facts for the trackers' tags (the study's name, ...)."""

    @property
    def is_parent(self) -> bool:
        return not self.member

    def run_name(self, run_dir: Path) -> str:
        """A member's run name in the trackers: `<stage>/<name>` for a sub-run, `confirm/trial_<n>/seed_<s>` for
        a sweep's confirmation run (its member, a path), the folder's name otherwise."""
        if self.stage:
            return f"{self.stage}/{Path(run_dir).name}"
        return self.member if "/" in self.member else Path(run_dir).name

    def tag_items(self) -> dict[str, str]:
        """The group as flat tags: currytrain.group, currytrain.group_kind, currytrain.trial (or .job,
        .subrun, .confirmation), currytrain.stage, currytrain.role, and the group's own tags."""
        member_key = "confirmation" if self.role == "confirm" else {"sweep": "trial", "multirun": "job"}.get(self.kind, "subrun")
        items = {"group": self.name, "group_kind": self.kind, member_key: self.member, "stage": self.stage, "role": self.role, **self.tags}
        return {f"currytrain.{key}": str(value) for key, value in items.items() if value not in ("", None)}


def record_group(journal: Journal, group: RunGroup | None) -> None:
    """Write the run's group to its journal, after the header (a relaunch into the folder keeps the first)."""
    if group is None or not journal.enabled or read_group(journal.path.parent) is not None:
        return
    journal.event(GROUP_EVENT, group=asdict(group))


def read_group(run_dir: str | Path) -> RunGroup | None:
    """The group the run's journal names (its first `group` event), or None for a run on its own."""
    journal = Path(run_dir) / "journal.jsonl"
    if not journal.is_file():
        return None
    with journal.open() as file:
        for line in file:
            if f'"{GROUP_EVENT}"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("type") == GROUP_EVENT and isinstance(record.get("group"), dict):
                fields = record["group"]
                return RunGroup(**{name: fields[name] for name in RunGroup.__dataclass_fields__ if name in fields})
    return None


def group_name(folder: Path, cwd: Path | None = None) -> str:
    """A group's name in the trackers: its folder relative to where the command ran (runs/sweeps/tpe), or the
    absolute folder outside it."""
    try:
        return str(Path(folder).relative_to((cwd or Path.cwd()).resolve()))
    except ValueError:
        return str(folder)


def stores_dir(run_dir: str | Path, group: RunGroup | None = None) -> Path:
    """Where a run's default tracking stores lie: its group's (so a sweep's or ladder's members share one
    store with their parent), else the run folder's parent (one store per day folder)."""
    return Path(group.stores) if group is not None else Path(run_dir).resolve().parent


def ending_status(error: BaseException) -> str:
    """How a run that raised `error` ended, in close()'s words: pruned, aborted, interrupted or failed."""
    if isinstance(error, Pruned):
        return "pruned"
    if isinstance(error, Aborted):
        return "aborted"
    if isinstance(error, (Interrupted, KeyboardInterrupt)):
        return "interrupted"
    return "failed"


def hparam_value(value: Any) -> bool | int | float | str:
    """A value as the trackers' hparams take it: numbers, strings and booleans as they are, the rest as JSON."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, default=str)
