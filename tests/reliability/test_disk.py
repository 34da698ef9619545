"""A disk that fills up, or goes read-only, under a run: one clear message naming the cause, exit 1, the
earlier checkpoints intact, and a journal of whole lines that its reader still reads.

The run folder is a small tmpfs the test mounts (root only; skipped elsewhere)."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from conftest import launch
from currytrain.journal import read_journal
from currytrain.weights import checkpoint_problem, complete_checkpoints
from reliability.runs import RUN


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


FAULTS = {
    "disk full at a checkpoint": ("tests.faulty.DiskFiller", "leave_bytes:65536", "could not write the checkpoint step_4", "the disk is full"),
    "disk full at a log line": ("tests.faulty.DiskFiller", "leave_bytes:0", "", "the disk is full"),
    "read-only at a journal line": ("tests.faulty.ReadOnlyAfter", "", "could not append to the journal", "the file system is read-only"),
}


@pytest.mark.reliability(fault="storage failure mid-run", protection="clear message, run stops, earlier checkpoints intact, whole journal lines")
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_storage_failure_stops_the_run_cleanly(fault, small_disk, record_property):
    target, argument, where, cause = FAULTS[fault]
    run_dir = small_disk / "run"
    component = f"+logger.fault={{_target_:{target},at:3{',' + argument if argument else ''}}}"
    result = launch(*RUN, component, f"hydra.run.dir={run_dir}")
    assert result.returncode == 1, result.stderr[-3000:]
    assert where in result.stderr and cause in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "unexpected pos" not in result.stderr
    assert [path.name for path in complete_checkpoints(run_dir / "checkpoints")] == ["step_2"]
    assert checkpoint_problem(run_dir / "checkpoints" / "step_2") is None
    lines = (run_dir / "journal.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines), "every journal line is whole"
    assert max(event.get("step", 0) for event in read_journal(run_dir / "journal.jsonl")) >= 2
    record_property("data_lost", 0)
