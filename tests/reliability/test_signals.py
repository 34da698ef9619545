"""Ctrl-C, SIGTERM and SLURM's SIGUSR1 warning: the step finishes, a checkpoint is saved and journaled, the
command exits 128 + the signal with one short line, and trainer.resume=auto ends with the weights of the
uninterrupted run (test_kill_resume.py's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, TINY
from currytrain.journal import read_journal
from currytrain.weights import checkpoint_problem
from reliability.runs import RUN, same_weights

SLOW = "+logger.slow={_target_:tests.faulty.SlowLogger,seconds:0.3}"
"""Steps slow enough for the signal to arrive mid-run."""


def _journal(run_dir):
    path = run_dir / "journal.jsonl"
    return read_journal(path) if path.exists() else []


def _interrupt(run_dir, signum: int, *overrides: str) -> subprocess.CompletedProcess:
    """Start the run, send `signum` once its journal shows step 2, and wait for it to end."""
    args = [sys.executable, str(ROOT / "launch.py"), *TINY, *RUN, SLOW, *overrides, f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600  # a loaded machine can take minutes to start workers
    while not any(event["type"] == "metrics" and event["step"] >= 2 for event in _journal(run_dir)):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.05)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=240)
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.reliability(fault="signal to a single-process run", protection="finish the step, checkpoint, journal, exit 128+N; resume=auto")
# SIGTERM and SIGUSR1 take the same handler in one process (StopSignals); SIGTERM is sent in the 2-worker test below.
@pytest.mark.parametrize("signum", [signal.SIGINT], ids=["Ctrl-C (SIGINT)"])
def test_a_signal_saves_journals_and_resumes_to_the_uninterrupted_weights(signum, uninterrupted, tmp_path, record_property):
    run_dir = tmp_path / "run"
    result = _interrupt(run_dir, signum)
    assert result.returncode == 128 + signum, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (interrupted,) = [event for event in _journal(run_dir) if event["type"] == "interrupted"]
    step = interrupted["step"]
    assert interrupted["signal"] == signal.Signals(signum).name and interrupted["checkpoint"] == f"checkpoints/step_{step}"
    assert f"stopped by {signal.Signals(signum).name} after step {step}: checkpoint checkpoints/step_{step} saved" in result.stderr
    assert step < 8, "the run stopped early"

    resumed = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *TINY, *RUN, "trainer.resume=auto", f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = _journal(run_dir)
    assert [e["step"] for e in events if e["type"] == "resume"] == [step]
    assert same_weights(run_dir, uninterrupted)
    record_property("data_lost", 0)


@pytest.mark.slow
@pytest.mark.reliability(fault="SIGTERM to the launcher of 2 workers", protection="workers agree on a stop step, checkpoint, journal, exit 143; resume=auto")
def test_a_signal_to_the_launcher_of_workers_saves_journals_and_resumes(tmp_path, record_property):
    run_dir, layout = tmp_path / "run", ("parallel=ddp", "parallel.nproc=2")
    result = _interrupt(run_dir, signal.SIGTERM, *layout)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (interrupted,) = [event for event in _journal(run_dir) if event["type"] == "interrupted"]
    step = interrupted["step"]
    assert interrupted["signal"] == "SIGTERM" and interrupted["checkpoint"] == f"checkpoints/step_{step}" and step < 8
    assert f"stopped by SIGTERM after step {step}: checkpoint checkpoints/step_{step} saved" in result.stderr
    assert checkpoint_problem(run_dir / "checkpoints" / f"step_{step}") is None
    assert not any(event["type"] == "worker_failed" for event in _journal(run_dir)), "a stop both workers agreed on is not a failure"
    workers = []
    for rank in (0, 1):
        lines = (run_dir / "workers" / f"rank_{rank}.stdout").read_text().splitlines()
        workers += [int(line.split()[-1]) for line in lines if line.startswith("curryTrain worker")]
    assert len(workers) == 2 and not any(_alive(pid) for pid in workers), "a worker outlived its launcher"

    resumed = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *TINY, *RUN, *layout, "trainer.resume=auto", f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = _journal(run_dir)
    assert [e["step"] for e in events if e["type"] == "resume"] == [step] and events[-1]["type"] == "finish"
    record_property("data_lost", 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.reliability(
    fault="SIGTERM while the run starts (before its training loop)", protection="the start-up answers SIGTERM: journaled as interrupted, exit 143"
)
def test_a_sigterm_while_the_run_starts_is_journaled_and_exits_143(tmp_path, record_property):
    run_dir = tmp_path / "run"
    slow = ("build.allow=[tests.faulty.SlowStart]", "+logger.slow={_target_:tests.faulty.SlowStart,seconds:120}")
    args = [sys.executable, str(ROOT / "launch.py"), *TINY, *slow, "logger=[jsonl]", f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run_dir / "starting").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert _journal(run_dir)[-1] | {"time": None} == {"type": "interrupted", "time": None, "signal": "SIGTERM", "checkpoint": None}
    record_property("data_lost", 0)
