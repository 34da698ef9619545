"""JSONL backend: one line per logged step, {"step": N, name: value, ...}; easy to read back with pandas."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path


class JsonlLogger:
    def __init__(self, run_dir: str, filename: str = "metrics.jsonl"):
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("a", buffering=1)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.file.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")

    def log_config(self, config: Mapping) -> None:
        pass  # the journal header and resolved.yaml already hold the config

    def close(self) -> None:
        self.file.close()
