"""The run-folder lock (currytrain.lock): two processes never write one run folder; a dead holder's lock is taken
over with a journal line; readers never need it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY, launch, launch_argv
from currytrain import lock
from currytrain.cli import main as cli
from currytrain.errors import ConfigError
from currytrain.journal import read_journal

SLOW = ("logger=[jsonl]", "build.allow=[tests.faulty.SlowLogger]", "+logger.slow={_target_:tests.faulty.SlowLogger,seconds:0.4}", "trainer.max_steps=12")
"""A run of about 5 s after its start-up: long enough for a second process to arrive while it holds the folder."""


def popen_launch(*overrides: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, str(ROOT / "launch.py"), *launch_argv(overrides, tiny=True)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def hold_in_another_process(run_dir: Path) -> subprocess.Popen:
    """A process that holds `run_dir` until killed (the lock module alone: no torch, no Hydra)."""
    code = f"import sys, time; from currytrain.lock import acquire; acquire({str(run_dir)!r}); print('held', flush=True); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.reliability(fault="two runs started at once into one run folder", protection="run-folder lock: the second exits 2 naming the holder and the fix")
def test_two_runs_started_at_once_into_one_folder_one_runs_and_the_other_exits_2_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    runs = {seed: popen_launch(*SLOW, f"seed={seed}", f"hydra.run.dir={run_dir}") for seed in (0, 7)}
    results = {seed: (run.wait(timeout=300), *run.communicate()) for seed, run in runs.items()}
    codes = sorted(code for code, _, _ in results.values())
    assert codes == [0, 2], {seed: (code, err[-2000:]) for seed, (code, _, err) in results.items()}
    winner = next(seed for seed, (code, _, _) in results.items() if code == 0)
    loser = next(seed for seed in results if seed != winner)
    refusal = results[loser][2]
    assert f"is in use by pid {runs[winner].pid} on {socket.gethostname()}, started 20" in refusal, refusal
    assert f"seed={winner}" in refusal and "launch.py" in refusal, "the holder's command is named"
    assert "hydra.run.dir=<new folder>" in refusal and "Traceback" not in refusal
    records = read_journal(run_dir / "journal.jsonl")
    assert [r["type"] for r in records].count("start") == 1 and records[0]["type"] == "header" and records[0]["seed"] == winner
    assert not any(r["type"] == "launch" for r in records), "the refused run wrote nothing into the folder"
    assert not (run_dir / "run.lock").read_text(), "the lock is released when the run ends"


@pytest.mark.reliability(fault="a run into a folder another process holds", protection="run-folder lock: exit 2 naming the holder; readers need no lock")
def test_a_held_folder_refuses_a_resume_and_still_serves_its_readers(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert launch("logger=[jsonl]", "trainer.max_steps=3", f"hydra.run.dir={run_dir}").returncode == 0
    holder = hold_in_another_process(run_dir)
    try:
        before = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*") if path.is_file()}
        refused = launch("logger=[jsonl]", "trainer.max_steps=5", "trainer.resume=auto", f"hydra.run.dir={run_dir}")
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert f"is in use by pid {holder.pid} on {socket.gethostname()}" in refused.stderr and "wait until that run ends" in refused.stderr
        assert {path: path.stat().st_mtime_ns for path in run_dir.rglob("*") if path.is_file()} == before, "nothing written"
        for command in (["journal", str(run_dir)], ["diagnose", str(run_dir)], ["verify", str(run_dir)]):
            assert cli(command) == 0, command
        assert "finish" in capsys.readouterr().out
    finally:
        holder.kill()
        holder.wait()
    resumed = launch("logger=[jsonl]", "trainer.max_steps=5", "trainer.resume=auto", f"hydra.run.dir={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    takeover = [r for r in read_journal(run_dir / "journal.jsonl") if r["type"] == "lock_takeover"]
    assert len(takeover) == 1 and takeover[0]["previous"]["pid"] == holder.pid and "no longer running" in takeover[0]["reason"]


@pytest.mark.reliability(fault="kill -9 (SIGKILL) of a run holding its folder", protection="stale lock (dead pid) taken over with a journal line; resume=auto")
def test_a_killed_runs_lock_is_taken_over_by_its_resume_with_a_journal_line(tmp_path):
    run_dir = tmp_path / "run"
    killed = popen_launch(
        "logger=[jsonl]",
        "build.allow=[tests.faulty.Killer]",
        "+logger.kill={_target_:tests.faulty.Killer,at:3}",
        "trainer.checkpoint_every=2",
        f"hydra.run.dir={run_dir}",
    )
    assert killed.wait(timeout=300) == -signal.SIGKILL
    killed.communicate()
    stale = json.loads((run_dir / "run.lock").read_text())
    assert stale["pid"] == killed.pid, "a SIGKILLed holder leaves its description behind"
    resumed = launch("logger=[jsonl]", "trainer.checkpoint_every=2", "trainer.resume=auto", f"hydra.run.dir={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    records = read_journal(run_dir / "journal.jsonl")
    takeover = [r for r in records if r["type"] == "lock_takeover"]
    assert len(takeover) == 1 and takeover[0]["previous"]["pid"] == killed.pid
    assert [r["type"] for r in records].index("lock_takeover") < [r["type"] for r in records].index("resume")
    assert records[-1]["type"] == "finish" and records[-1]["step"] == int(dict(o.split("=") for o in TINY)["trainer.max_steps"])


def write_holder(run_dir: Path, **fields) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    holder = {"pid": 1, "host": "node-b", "started": "2030-01-01T00:00:00+00:00", "command": "launch.py", "heartbeat": time.time(), **fields}
    (run_dir / lock.LOCK_FILE).write_text(json.dumps(holder))


def test_a_holder_on_another_host_is_live_until_its_heartbeat_is_stale(tmp_path, monkeypatch):
    write_holder(tmp_path / "fresh", heartbeat=time.time() - 5)
    with pytest.raises(ConfigError, match="in use by pid 1 on node-b, started 2030-01-01"):
        lock.acquire(tmp_path / "fresh")
    assert lock.held_by_another(tmp_path / "fresh") is not None
    write_holder(tmp_path / "stale", heartbeat=time.time() - lock.STALE_S - 5)
    assert lock.held_by_another(tmp_path / "stale") is None
    with lock.acquire(tmp_path / "stale") as held:
        assert held.took_over["previous"]["host"] == "node-b" and "heartbeat" in held.took_over["reason"]
        mine = json.loads((tmp_path / "stale" / lock.LOCK_FILE).read_text())
        assert mine["pid"] == os.getpid() and mine["host"] == socket.gethostname()
    # A requeued SLURM job (same job id, another node and pid) takes over its own earlier incarnation at once.
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    write_holder(tmp_path / "requeued", job="4242", heartbeat=time.time())
    with lock.acquire(tmp_path / "requeued") as held:
        assert "SLURM job 4242 (requeued)" in held.took_over["reason"]


def test_the_same_process_nests_its_hold_and_a_dead_pid_on_this_host_is_stale(tmp_path):
    with lock.acquire(tmp_path / "a") as outer:
        assert lock.acquire(tmp_path / "a") is outer and outer.count == 2
        outer.release()
        assert lock.held_by_another(tmp_path / "a") is None, "this process's own hold does not block it"
    assert not lock._HELD
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    write_holder(tmp_path / "b", pid=int(dead), host=socket.gethostname())
    with lock.acquire(tmp_path / "b") as held:
        assert held.took_over["previous"]["pid"] == int(dead)
