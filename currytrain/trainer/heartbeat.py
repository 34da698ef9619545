"""Per-rank heartbeats: where each rank of a multi-process run is, so that `currytrain diagnose` can name the
rank a stalled run waits for (the journal is rank 0's alone, and rank 0 only sees that a collective hangs).

One small file per rank, <run>/workers/rank_<r>.heartbeat, rewritten in place at each phase of each step. No
fsync: after a kill the page cache still holds the last beat, and a torn read is skipped by the reader.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

PHASES = ("data", "compute", "done")
"""A step's phases in order: reading its batches; forward, backward, optimizer, eval and checkpoint (every
collective is there); finished."""
PHASE_WORDS = {"data": "reading its batches", "compute": "computing (inside the step's collectives)", "done": "between steps"}


class Heartbeat:
    """Writes this rank's step and phase; does nothing when disabled (one process: the journal suffices)."""

    def __init__(self, run_dir: Path, rank: int, enabled: bool):
        self.file = None
        if enabled:
            path = Path(run_dir) / "workers" / f"rank_{rank}.heartbeat"
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "w")  # noqa: SIM115 - kept open for the run: one write per beat

    def beat(self, step: int, phase: str) -> None:
        if self.file is None:
            return
        self.file.seek(0)
        self.file.write(json.dumps({"step": step, "phase": phase, "time": time.time(), "pid": os.getpid()}))
        self.file.truncate()
        self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def read_heartbeats(run_dir: Path) -> dict[int, dict[str, Any]]:
    """rank -> its last beat ({step, phase, time, pid}), for the ranks whose file reads back whole."""
    beats = {}
    for path in (Path(run_dir) / "workers").glob("rank_*.heartbeat"):
        try:
            beat = json.loads(path.read_text())
            rank = int(path.stem.split("_")[1])
        except (ValueError, OSError, IndexError):
            continue
        step = beat.get("step") if isinstance(beat, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and beat.get("phase") in PHASES:  # else a damaged file: left out
            beats[rank] = beat
    return beats


def progress(beat: dict[str, Any]) -> tuple[int, int]:
    """How far a beat is into the run: (step, phase index)."""
    return beat["step"], PHASES.index(beat["phase"]) if beat.get("phase") in PHASES else 0
