"""The Optuna study of a sweep: its storage, the spec a trial's job reads, and each trial's outcome.

A trial's outcome is read from what its job left: the job's return (when the sweeper saw it end) or its run
folder's journal (when the sweeper was killed while the job ran, or the job outlived it). The journal is the
record: `finish` is COMPLETE with the objective's value, `pruned` is PRUNED, `failure`/`config_error`/`abort`
are FAIL with their message, and no ending at all is an interrupted trial.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from currytrain.journal import read_journal
from currytrain.lock import STALE_S, Holder, exclusive, held_by_another, me, pid_alive

SPEC_FILE = "sweep.json"
ENV_SPEC = "CURRYTRAIN_SWEEP"
"""Environment variable a trial's job receives: the path of the sweep's spec (study, storage, pruner)."""
ENV_TRIAL = "CURRYTRAIN_TRIAL"
"""Environment variable a trial's job receives: the trial's number in the study."""
SQLITE_TIMEOUT_S = 30
"""How long an SQLite writer waits for the lock: trials report while the sweeper writes."""
ENDINGS = {"finish", "pruned", "failure", "config_error", "abort"}


@dataclass(frozen=True)
class SweepSpec:
    """What a trial's job needs to talk to its study (written to <sweep>/sweep.json)."""

    study_name: str
    storage: str
    directions: list[str]
    objectives: list[str]
    pruner: dict[str, Any] | None

    def save(self, sweep_dir: Path) -> Path:
        """Written whole (renamed into place): sweepers sharing the folder rewrite it while trials read it."""
        path = sweep_dir / SPEC_FILE
        partial = path.with_name(f"{SPEC_FILE}.{os.getpid()}.partial")
        partial.write_text(json.dumps(self.__dict__, indent=2) + "\n")
        os.replace(partial, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> SweepSpec:
        return cls(**json.loads(Path(path).read_text()))


def default_storage(sweep_dir: Path) -> str:
    return f"sqlite:///{(sweep_dir / 'optuna.db').resolve()}"


def claim_lock(uri: str) -> Path | None:
    """The file beside a file-based storage (SQLite, journal) that sweepers of this host flock while they open the
    study, count its trials and ask new ones; None for a server (postgresql://...), which sees no such lock."""
    for prefix in ("sqlite:///", "journal://"):
        if uri.startswith(prefix):
            return Path(uri.removeprefix(prefix) + ".claims")  # not <file>.lock: Optuna's journal takes that name
    return None


@contextlib.contextmanager
def claiming(uri: str) -> Iterator[None]:
    """One sweeper at a time counts the study's trials and asks new ones, so that concurrent sweepers of one study
    start exactly n_trials (a trial asked is RUNNING, and counts for every other sweeper at once)."""
    path = claim_lock(uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(path):
        yield


def sweeper_identity() -> dict[str, Any]:
    """Who asked a trial (kept in its user attributes): a later sweeper leaves a trial alone while its asker lives."""
    holder = me()
    return {"pid": holder.pid, "host": holder.host, "proc_start": holder.proc_start}


def asker_alive(trial: Any) -> bool:
    """Whether `trial` may still be running: its run folder is held by a live process (its job, which may outlive
    its sweeper), or the sweeper that asked it still runs (this host: by pid; another host, which this one cannot
    see into: for STALE_S after the trial started). A trial from before sweepers signed theirs counts as abandoned."""
    run_dir = trial.user_attrs.get("run_dir")
    if run_dir and held_by_another(run_dir) is not None:
        return True
    asker = trial.user_attrs.get("sweeper")
    if not asker:
        return False
    if asker["host"] != me().host:
        started = trial.datetime_start
        return started is not None and (dt.datetime.now() - started).total_seconds() < STALE_S
    if int(asker["pid"]) == os.getpid():
        return True
    return pid_alive(Holder(pid=int(asker["pid"]), host=asker["host"], started="", command="", heartbeat=0.0, proc_start=asker.get("proc_start")))


def join(study: Any) -> int:
    """Sign this sweeper into the study; the number of other sweepers of it still alive (they reseed apart)."""
    mine = sweeper_identity()
    others = 0
    for key, asker in study.user_attrs.items():
        if key.startswith("sweeper:") and key != f"sweeper:{mine['host']}:{mine['pid']}":
            alive = asker["host"] != mine["host"] or pid_alive(Holder(int(asker["pid"]), asker["host"], "", "", 0.0, asker.get("proc_start")))
            others += alive
    study.set_user_attr(f"sweeper:{mine['host']}:{mine['pid']}", mine)
    return others


def open_storage(uri: str) -> Any:
    """An Optuna storage: SQLite with a lock timeout, journal:///file for JournalFileBackend, or any RDB URL."""
    import optuna

    if uri.startswith("journal://"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(uri.removeprefix("journal://")))
    engine = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if uri.startswith("sqlite") else {}
    return optuna.storages.RDBStorage(uri, engine_kwargs=engine)


SAMPLER_STATE = re.compile(r"^(?P<prefix>.+):optimizer:(?P<index>\d+)$")
"""The trial system attributes in which Optuna's CmaEsSampler keeps its optimizer, pickled and hex-encoded in pieces
(cma:optimizer:0, cma:optimizer:1, ...); it unpickles them with plain pickle when it next samples."""


def sampler_state_allowed() -> dict[tuple[str, str], Any]:
    """The exact globals the pickled state of a CMA-ES optimizer holds: the cmaes classes and numpy arrays."""
    import numpy

    allowed: dict[tuple[str, str], Any] = {("numpy", "dtype"): numpy.dtype, ("numpy", "ndarray"): numpy.ndarray}
    from numpy._core import multiarray  # numpy 2's home of the array reconstruction (numpy.core is its old name)

    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = multiarray._reconstruct
        allowed[(module, "scalar")] = multiarray.scalar
    try:
        import cmaes
    except ImportError:
        return allowed
    for module, name in (("cmaes._cma", "CMA"), ("cmaes._sepcma", "SepCMA"), ("cmaes._cmawm", "CMAwM")):
        if hasattr(cmaes, name):
            allowed[(module, name)] = getattr(cmaes, name)
    return allowed


def sampler_state_problem(study: Any) -> str | None:
    """Why the study's stored sampler state must not be unpickled (it names something a CMA-ES optimizer never
    holds: a storage crafted to run code), or None. Checked before the sampler can read it: a study's storage is
    not trusted (it may be shared, or copied from elsewhere)."""
    from currytrain.safepickle import UnsafePickle, safe_loads

    allowed = sampler_state_allowed()
    for trial in study.get_trials(deepcopy=False):
        pieces: dict[str, dict[int, Any]] = {}
        for key, value in trial.system_attrs.items():
            if match := SAMPLER_STATE.match(str(key)):
                pieces.setdefault(match["prefix"], {})[int(match["index"])] = value
        for prefix, parts in pieces.items():
            where = f"trial {trial.number}'s system attribute {prefix}:optimizer"
            try:
                text = "".join(str(parts[index]) for index in range(len(parts)))
                safe_loads(bytes.fromhex(text), allowed, what=where)
            except (KeyError, ValueError) as error:
                return f"{where} is not the pieces of a hex-encoded pickle ({error})"
            except UnsafePickle as error:
                return str(error)
    return None


@dataclass(frozen=True)
class Outcome:
    """How a trial ended: state is COMPLETE, PRUNED, FAIL or None (no ending found: interrupted)."""

    state: str | None
    values: list[float] | None = None
    reason: str = ""
    config_error: str | None = None
    """Set when the trial shows the sweep's config is wrong (a task returning a value per direction it lacks)."""


def _metric(events: Sequence[dict], name: str) -> float | None:
    """One objective's value from a run's journal events."""
    finish = next((e for e in reversed(events) if e.get("type") == "finish"), {})
    if name in ("val/loss", "val/bits_per_token") and "val_loss" in finish:
        return finish["val_loss"] / (math.log(2) if name == "val/bits_per_token" else 1.0)
    if name == "run/seconds":
        return finish.get("seconds")
    if name == "model/num_params":
        return next((e["num_params"] for e in events if e.get("type") == "start"), None)
    if name == "train/loss":
        return next((e["train/loss"] for e in reversed(events) if e.get("type") == "metrics" and "train/loss" in e), None)
    return None


def completed(values: list[float | None], objectives: Sequence[str]) -> Outcome:
    """COMPLETE, or FAIL when an objective is missing or not finite (a NaN trial must never be best)."""
    for name, value in zip(objectives, values):
        if value is None or not math.isfinite(value):
            return Outcome("FAIL", reason=f"objective {name} is {value}: not a finite number")
    return Outcome("COMPLETE", [float(v) for v in values])


def outcome_from_journal(run_dir: Path, objectives: Sequence[str]) -> Outcome:
    path = run_dir / "journal.jsonl"
    events = [e for e in read_journal(path) if "type" in e] if path.is_file() else []
    ending = next((e for e in reversed(events) if e["type"] in ENDINGS), None)
    if ending is None:
        return Outcome(None, reason="interrupted: the sweeper stopped before the trial ended, and its run folder holds no result")
    if ending["type"] == "finish":
        return completed([_metric(events, name) for name in objectives], objectives)
    if ending["type"] == "pruned":
        return Outcome("PRUNED", reason=ending.get("message", "pruned"))
    return Outcome("FAIL", reason=f"{ending['type']}: {ending.get('message', '')}".strip())


def returned_values(returned: Any) -> list[float] | None:
    """A task's return as numbers, read as hydra-optuna-sweeper reads it (float() of the value, or of each
    item of a tuple, list or 1-d array); None when it is not numbers."""
    several = isinstance(returned, (list, tuple)) or type(returned).__name__ == "ListConfig" or getattr(returned, "ndim", 0) >= 1
    try:
        return [float(value) for value in (returned if several else [returned])]
    except (TypeError, ValueError):
        return None


def outcome_of(job_return: Any, run_dir: Path, objectives: Sequence[str], *, from_journal: bool = True, direction_key: str = "sweep.direction") -> Outcome:
    """A launched job's outcome: its raised outcome or, when it returned, the objective values it journaled
    (from_journal: a curryTrain run) or returned (a plain Hydra app, one value per direction)."""
    from hydra.core.utils import JobStatus

    from currytrain.errors import PastHydra, Pruned

    if isinstance(job_return, BaseException):  # the job's process died (submitit says why)
        return Outcome("FAIL", reason=f"the job died: {type(job_return).__name__}: {' '.join(str(job_return).split())[:500]}")
    if job_return.status == JobStatus.FAILED:
        error = job_return._return_value
        error = error.error if isinstance(error, PastHydra) else error  # a SLURM job's outcome, as the launcher relays it
        if isinstance(error, Pruned):
            return Outcome("PRUNED", reason=str(error))
        return Outcome("FAIL", reason=f"{type(error).__name__}: {' '.join(str(error).split())}")
    if from_journal and (run_dir / "journal.jsonl").is_file():  # a curryTrain run: its journal holds every objective
        return outcome_from_journal(run_dir, objectives)
    returned = job_return.return_value
    values = returned_values(returned)
    if values is None:
        return Outcome("FAIL", reason=f"the task returned {returned!r}: expected {len(objectives)} number(s), one per direction")
    if len(values) != len(objectives):
        problem = (
            f"{direction_key} has {len(objectives)} direction(s) but the task returned {len(values)} value(s) ({returned!r}): "
            f"give one direction per returned value (e.g. {direction_key}=[{', '.join(['minimize'] * len(values))}]), or return {len(objectives)} value(s)"
        )
        return Outcome("FAIL", reason=problem, config_error=problem)
    return completed(values, objectives)


def tell(study: Any, trial_number: int, outcome: Outcome) -> None:
    """Record the outcome (the reason goes to the trial's user attributes)."""
    from optuna.trial import TrialState

    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, trial_number)
    if outcome.reason:
        study._storage.set_trial_user_attr(trial_id, "reason", outcome.reason[:2000])
    state = TrialState[outcome.state]
    try:
        study.tell(trial_number, state=state, values=outcome.values if state == TrialState.COMPLETE else None, skip_if_finished=True)
    except RuntimeError as error:
        # GridSampler asks the study to stop once its grid is walked, which Optuna allows only inside
        # study.optimize(); the trial is stored before that (the sweep loop stops at the grid's size itself).
        if "Study.stop" not in str(error):
            raise


def counted(study: Any) -> int:
    """Trials that count toward n_trials: every trial asked, except interrupted ones asked again (requeued)."""
    from optuna.trial import TrialState

    return sum(1 for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING and not t.user_attrs.get("requeued"))


def failures(study: Any) -> int:
    from optuna.trial import TrialState

    return sum(1 for t in study.get_trials(deepcopy=False) if t.state == TrialState.FAIL and not t.user_attrs.get("interrupted"))


def recover_interrupted(study: Any, objectives: Sequence[str], mode: str) -> list[str]:
    """Trials a killed sweeper left RUNNING (its process is gone: asker_alive): recorded from their run folders'
    journals, or, with no result there, FAIL (mode fail) or FAIL and asked again with the same parameters (mode
    requeue). Trials of live sweepers sharing the study are left alone. Returns lines saying what was done."""
    from optuna.trial import TrialState

    notes = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if asker_alive(trial):  # another sweeper (or this one) runs it now
            continue
        outcome = outcome_from_journal(Path(trial.user_attrs.get("run_dir", "")), objectives)
        if outcome.state is None:
            trial_id = trial._trial_id
            study._storage.set_trial_user_attr(trial_id, "interrupted", True)
            if mode == "requeue":
                study._storage.set_trial_user_attr(trial_id, "requeued", True)
                study.enqueue_trial(trial.params, user_attrs={"requeued_from": trial.number}, skip_if_exists=False)
            outcome = Outcome("FAIL", reason=outcome.reason)
        tell(study, trial.number, outcome)
        notes.append(f"trial {trial.number} left running by an earlier sweeper: recorded {outcome.state} ({outcome.reason or 'from its journal'})")
    return notes


def job_env(spec_path: Path, trial_number: int) -> list[str]:
    """Overrides that hand the trial to its job through Hydra's per-job environment (hydra.job.env_set)."""
    return [f"++hydra.job.env_set.{ENV_SPEC}='{spec_path}'", f"++hydra.job.env_set.{ENV_TRIAL}={trial_number}"]


def trial_from_env() -> tuple[SweepSpec, int] | None:
    """The (spec, trial number) of the job this process runs, or None outside a sweep."""
    spec, number = os.environ.get(ENV_SPEC), os.environ.get(ENV_TRIAL)
    if not spec or number is None:
        return None
    return SweepSpec.load(spec), int(number)
