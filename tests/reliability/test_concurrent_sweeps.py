"""Concurrent sweeps on one study: four `launch.py -m` sweepers started at once on one storage (the default SQLite
and Optuna's journal file) run exactly n_trials trials together, none twice, none lost, no "database is locked";
a sweeper killed in the middle of a trial leaves it to be recovered, and a restart completes the study."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from conftest import ROOT, launch_argv
from currytrain.sweep.study import claiming, open_storage

SWEEPERS = 4
N_TRIALS = 8
TRIAL = ("logger=[jsonl]", "data.max_bytes=300000", "trainer.max_steps=4", "trainer.eval_every=2")
"""Tiny trials (4 steps, evaluated at 2 and 4, so the ASHA pruner gets reports to write into the storage)."""


def sweeper(sweep_dir: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    args = ["-m", "sweep=asha", f"sweep.n_trials={N_TRIALS}", *TRIAL, f"hydra.sweep.dir={sweep_dir}", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}  # four processes on a few cores
    return subprocess.Popen(
        [sys.executable, str(ROOT / "launch.py"), *launch_argv(tuple(args), tiny=True)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def storage_of(sweep_dir: Path, kind: str) -> tuple[str, list[str]]:
    if kind == "journal":
        uri = f"journal://{sweep_dir / 'study.log'}"
        return uri, [f"sweep.storage='{uri}'"]
    return f"sqlite:///{sweep_dir / 'optuna.db'}", []


def trials_of(uri: str) -> list:
    return optuna.load_study(study_name="asha", storage=open_storage(uri)).get_trials(deepcopy=False)


def trials_so_far(uri: str) -> list:
    """trials_of while the sweepers start, under the lock they create the storage under (study.claiming: opening an
    SQLite storage creates its tables, which must not race a sweeper doing the same); the storage can exist before
    any of them has created the study in it."""
    try:
        with claiming(uri):
            return trials_of(uri)
    except KeyError:  # optuna's "Record does not exist.": no study of that name yet
        return []


def assert_exactly_n_trials_none_twice_none_lost(trials: list, outputs: list[str]) -> list:
    """The trials that count (a requeued one is replaced by its second asking): n_trials of them, each run once in
    its own folder to its end, the four sweepers' samplers apart, no storage lock error in any output."""
    assert not any("database is locked" in out for out in outputs)
    assert sorted(t.number for t in trials) == list(range(len(trials))), "trial numbers given once each"
    counted = [t for t in trials if not t.user_attrs.get("requeued")]
    assert len(counted) == N_TRIALS and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in counted), [
        (t.number, t.state, t.user_attrs.get("reason")) for t in trials
    ]
    assert len({t.user_attrs["run_dir"] for t in trials}) == len(trials)
    fresh = [t for t in counted if "requeued_from" not in t.user_attrs]
    assert len({t.params["optimizer.lr"] for t in fresh}) == len(fresh), "the samplers of the sweepers proposed apart"
    assert len({t.user_attrs["sweeper"]["pid"] for t in trials}) > 1, "the trials were shared out"
    for trial in counted:  # each ran once, in its own folder, to its end
        journal = Path(trial.user_attrs["run_dir"], "journal.jsonl").read_text()
        assert journal.count('"type": "start"') == 1 and ('"type": "finish"' in journal or '"type": "pruned"' in journal)
    return counted


@pytest.mark.slow
@pytest.mark.reliability(
    fault="four sweepers started at once on one study", protection="count-and-ask under a lock beside the storage; samplers reseeded apart"
)
def test_four_sweepers_at_once_on_a_journal_file_storage_run_exactly_n_trials(tmp_path):
    sweep_dir = tmp_path / "sweep"
    uri, extra = storage_of(sweep_dir, "journal")
    processes = [sweeper(sweep_dir, *extra) for _ in range(SWEEPERS)]
    outputs = [process.communicate(timeout=900)[0] for process in processes]
    assert [process.returncode for process in processes] == [0] * SWEEPERS, "\n".join(out[-2000:] for out in outputs)
    assert len(assert_exactly_n_trials_none_twice_none_lost(trials_of(uri), outputs)) == len(trials_of(uri))


@pytest.mark.slow
@pytest.mark.reliability(
    fault="four sweepers at once on the default SQLite storage, one killed mid-trial",
    protection="its trial recovered (FAIL, asked again); the others and a restart complete exactly n_trials",
)
def test_four_sweepers_at_once_on_sqlite_one_killed_mid_trial_and_a_restart_complete_the_study(tmp_path):
    sweep_dir = tmp_path / "sweep"
    uri, _ = storage_of(sweep_dir, "sqlite")
    slow = ("build.allow=[tests.faulty.SlowLogger]", "+logger.slow={_target_:tests.faulty.SlowLogger,seconds:0.25}", "sweep.on_interrupted=requeue")
    # The victim's trials log slower still (the same config: a study refuses a sweeper whose overrides differ): after
    # the first metrics the poll sees, 5 more logs of 2 s each stand between it and the trial's end, however long the
    # poll waits for the storage's lock under load (at 0.25 s a log, a loaded make test once saw the victim's trial
    # finish before the kill landed).
    processes = [sweeper(sweep_dir, *slow, env={"SLOW_LOGGER_SECONDS": "2"})] + [sweeper(sweep_dir, *slow) for _ in range(SWEEPERS - 1)]
    victim, deadline, running = processes[0], time.monotonic() + 600, []
    while time.monotonic() < deadline and victim.poll() is None:  # until the victim's first trial is training
        mine = (
            [t for t in trials_so_far(uri) if t.state == TrialState.RUNNING and t.user_attrs.get("sweeper", {}).get("pid") == victim.pid]
            if (sweep_dir / "optuna.db").exists()
            else []
        )
        journal = Path(mine[0].user_attrs["run_dir"], "journal.jsonl") if mine else None
        if journal is not None and journal.exists() and '"type": "metrics"' in journal.read_text():
            running = mine
            break
        time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)
    said = victim.communicate()[0]
    assert running, f"the victim was killed while it trained a trial; it said:\n{said[-3000:]}"
    killed = running[0].number
    outputs = [process.communicate(timeout=900)[0] for process in processes[1:]]
    assert [process.returncode for process in processes[1:]] == [0] * (SWEEPERS - 1), "\n".join(out[-2000:] for out in outputs)
    restart = sweeper(sweep_dir, *slow)
    outputs.append(restart.communicate(timeout=900)[0])
    assert restart.returncode == 0, outputs[-1][-3000:]
    trials = trials_of(uri)
    by_number = {t.number: t for t in trials}
    assert by_number[killed].state == TrialState.FAIL and by_number[killed].user_attrs["interrupted"] and by_number[killed].user_attrs["requeued"]
    asked_again = [t for t in trials if t.user_attrs.get("requeued_from") == killed]
    assert len(asked_again) == 1 and asked_again[0].params == by_number[killed].params and asked_again[0].state.is_finished()
    assert_exactly_n_trials_none_twice_none_lost(trials, outputs)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
