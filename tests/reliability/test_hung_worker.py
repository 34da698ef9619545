"""A worker that hangs: the launcher's hang watch (parallel.hang_timeout, currytrain/workers.py HangWatch)
stops the run and names the rank, and `currytrain diagnose` names it too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, TINY
from currytrain.journal import read_journal
from currytrain.report.diagnose import diagnose


@pytest.mark.slow
@pytest.mark.reliability(fault="a hung worker (2 workers)", protection="hang watch on the heartbeats: worker_hung names the rank, every worker stopped, exit 1")
def test_a_hung_rank_stops_the_run_and_is_named_by_its_heartbeat(tmp_path, record_property):
    """2 workers; rank 1 hangs reading the batches of step 4, rank 0 waits for it in the gradient all-reduce. The
    launcher's hang watch (parallel.hang_timeout) journals worker_hung naming rank 1, stops both workers and fails
    the run; diagnose names rank 1 from the per-rank heartbeats."""
    from currytrain.trainer.heartbeat import read_heartbeats

    hang = ["data._target_=tests.faulty.HangingBytes", "data.max_bytes=400000", "build.allow=[tests.faulty.HangingBytes]"]  # rank 1 hangs at step 4
    args = [
        sys.executable,
        str(ROOT / "launch.py"),
        *TINY,
        *hang,
        "parallel=ddp",
        "parallel.hang_timeout=4",
        "logger=[jsonl]",
        "trainer.max_steps=8",
        f"hydra.run.dir={tmp_path}",
    ]
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 1, stderr[-2000:]
    assert "the run hung: rank 1 stopped at step 4, reading its batches" in stderr and "Traceback" not in stderr, stderr[-2000:]
    (hung,) = [event for event in read_journal(tmp_path / "journal.jsonl") if event["type"] == "worker_hung"]
    assert (hung["rank"], hung["step"], hung["phase"]) == (1, 4, "data") and hung["seconds"] >= 4
    beats = read_heartbeats(tmp_path)
    assert beats[1]["phase"] == "data" and beats[0]["phase"] == "compute", beats
    for beat in beats.values():  # no worker left behind
        with pytest.raises(ProcessLookupError):
            os.kill(beat["pid"], 0)
    finding = diagnose(tmp_path)[0]
    assert finding.cause == "stall" and finding.step == 4, finding
    assert finding.summary.startswith("rank 1 stopped at step 4, reading its batches") and "they wait for rank 1" in finding.summary
    record_property("data_lost", 0)  # nothing written is touched: the run stops where its workers stood
