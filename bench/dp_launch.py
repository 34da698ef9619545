"""What the data-parallel benches share: run launch.py as a user would and read its journal back."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from currytrain.journal import read_journal  # noqa: E402


def launch_run(overrides: list[str], env: dict[str, str] | None = None) -> list[dict]:
    """`python launch.py <overrides>` into a fresh folder; its journal events (raises if the run failed)."""
    run_dir = Path(tempfile.mkdtemp(prefix="currytrain-bench-")) / "run"
    args = [sys.executable, str(ROOT / "launch.py"), *overrides, "trainer.progress=false", "logger=[jsonl]", f"hydra.run.dir={run_dir}"]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return read_journal(run_dir / "journal.jsonl")
