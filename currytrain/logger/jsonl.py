"""JSONL backend: one line per logged step, {"step": N, name: value, ...}; easy to read back with pandas.
Texts go to their own file (<filename stem>.text.jsonl) so every line of the metrics file stays numeric;
histograms are ignored."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class JsonlLogger:
    def __init__(self, run_dir: str, filename: str = "metrics.jsonl"):
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("a", buffering=1)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.file.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")

    def restarted(self, step: int) -> None:
        """Drop the lines of steps after `step` (a resume re-runs them), replacing the file atomically."""
        self.file.close()
        kept = [line for line in self.path.read_text().splitlines(keepends=True) if _step_of(line) <= step]
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text("".join(line if line.endswith("\n") else line + "\n" for line in kept))
        os.replace(partial, self.path)
        self.file = self.path.open("a", buffering=1)

    def log_config(self, config: Mapping) -> None:
        pass  # the journal header and resolved.yaml already hold the config

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        # Texts get their own file (<stem>.text.jsonl), so every line of the metrics file stays numeric.
        with self.path.with_suffix(".text.jsonl").open("a") as file:
            file.write(json.dumps({"step": step, "name": name, "text": text}) + "\n")

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        pass  # a histogram is not a scalar curve; TensorBoard and W&B show them

    def close(self, status: str = "finished") -> None:
        self.file.close()


def _step_of(line: str) -> float:
    """A metrics line's step; a line cut short by a killed process counts as after every step (dropped)."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")
