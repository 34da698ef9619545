"""The evaluators inside a training run: what the Trainer calls at its start, after every eval.every steps and after
its last step. Everything else (which evaluators, how they run on the sharded model, where results go) is here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from currytrain.build import build
from currytrain.eval.live import LiveModel
from currytrain.eval.runner import Evaluators, record, write_report
from currytrain.eval.source import run_codec
from currytrain.journal import current, read_journal
from currytrain.parallel.state import ParallelState


class InLoopEvaluation:
    """The run's Evaluators on its live model; results to the journal, the loggers and report.md (rank 0)."""

    def __init__(self, evaluators: Evaluators, live: LiveModel, config: dict[str, Any], run_dir: Path, journal: Any, loggers: Any):
        self.evaluators, self.live, self.config = evaluators, live, config
        self.run_dir, self.journal, self.loggers = run_dir, journal, loggers

    @classmethod
    def of(
        cls,
        cfg: DictConfig,
        model: nn.Module,
        state: ParallelState,
        autocast_dtype: torch.dtype | None,
        seq_len: int,
        run_dir: Path,
        journal: Any,
        loggers: Any,
    ) -> InLoopEvaluation | None:
        """The run's in-loop evaluation, or None with eval=none (or a config from before the eval group)."""
        node = cfg.get("eval")
        if node is None or node.get("_target_") is None:
            return None
        evaluators = build(node)
        live = LiveModel(model, state, autocast_dtype, evaluators.context(seq_len))
        return cls(evaluators, live, OmegaConf.to_container(cfg, resolve=True), Path(run_dir), journal, loggers)

    def prepare(self) -> None:
        """Before the first step: read the text sets, check every task's requests against the context."""
        self.evaluators.prepare(self.live, run_codec(self.config))

    def due(self, step: int) -> bool:
        return self.evaluators.due(step)

    def evaluate(self, step: int, final: bool = False) -> dict[str, float]:
        """Run every evaluator on the live model and record the results; after the last step, report.md too."""
        metrics = self.evaluators.run(self.live)
        record(metrics, step, self.journal, self.loggers, self.evaluators.higher_is_better)
        if final and self.journal.enabled:
            journal = self.run_dir / "journal.jsonl"
            evaluations = [event for event in current(read_journal(journal)) if event.get("type") == "evaluation"]
            write_report(self.run_dir, evaluations)
        return metrics
