"""JSONL backend: one line per logged step, {"step": N, name: value, ...}; easy to read back with pandas.
Texts go to their own file (<filename stem>.text.jsonl) so every line of the metrics file stays numeric;
histograms are ignored."""

from __future__ import annotations

import json
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
