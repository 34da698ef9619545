"""Data sources (conf/data/): byte corpora, tokenized text, synthetic token streams and tables of features,
cut into deterministic batches. Torch-free at import, so composing a config stays fast.

Beyond batch(split, step, micro, batch_size, rank, num_ranks) and describe(), an adapter may implement:

- eval_metrics(logits, targets) -> dict[str, float]: metrics the trainer averages over its val batches and
  logs as val/<name> beside the loss (a classifier's accuracy).
- leakage_report(**thresholds) -> list[pipeline.Leak]: the leakage checks of a split dataset, which the
  ladder's preflight stage turns into findings.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class HasEvalMetrics(Protocol):
    def eval_metrics(self, logits: Any, targets: Any) -> dict[str, float]: ...


@runtime_checkable
class HasLeakageReport(Protocol):
    def leakage_report(self, **thresholds: Any) -> list[Any]: ...
