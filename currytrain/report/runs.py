"""A run folder as data: its config, its journal, its curves and how it ended. Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from currytrain.errors import ConfigError
from currytrain.journal import current, flatten, read_journal
from currytrain.weights import RESOLVED, read_yaml_mapping

JOURNAL = "journal.jsonl"
SEED_KEYS = ("seed", "data.seed")
"""Config keys that differ between seeds of one experiment (data.seed follows seed)."""
IRRELEVANT_PREFIXES = (
    "logger.",
    "trainer.resume",
    "trainer.progress",
    "trainer.compile_cache",
    "trainer.init_from",
    "trainer.log_every",
    "trainer.checkpoint_every",
    "trainer.checkpoint_on_signal",
    "trainer.keep_last",
    "build.",
    "cost.",
    "sweep.",
)
"""Config keys that do not change what a run computes: output, logging, progress, checkpoint cadence, pricing,
and the sweep that launched it (a sweep's trial and the same config run alone are one experiment)."""


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    """The resolved config, flattened (a.b.c -> value)."""
    records: list[dict] = field(repr=False)

    @property
    def skipped(self) -> list[str]:
        """The journal lines a reader passed over ("line N: why")."""
        return getattr(self.records, "skipped", [])

    @property
    def events(self) -> list[dict]:
        return [r for r in self.records if r.get("type") not in ("header", "launch")]

    def last(self, kind: str) -> dict | None:
        return next((r for r in reversed(self.records) if r.get("type") == kind), None)

    @property
    def ending(self) -> str:
        """finish, config_error, abort, pruned, failure, or running/killed when no ending was journaled."""
        for record in reversed(self.records):
            if record.get("type") in ("finish", "config_error", "abort", "pruned", "failure"):
                return record["type"]
        return "unfinished"

    @property
    def seed(self) -> int | None:
        """The run's seed: its resolved config's, else its journal header's."""
        header = self.last("header") or {}
        seed = self.config.get("seed", header.get("seed"))
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None

    def final(self, metric: str) -> float | None:
        """The last value of `metric` in a finished run (its finish record's, else its last event's that holds
        it); None when the run did not finish or never recorded it."""
        if self.ending != "finish":
            return None
        value = next((r[metric] for r in reversed(self.events) if _number(r.get(metric))), None)
        return float(value) if value is not None else None

    def metric_names(self) -> set[str]:
        """The numeric fields its events hold (val_loss, train/loss, ...)."""
        return {k for r in self.events for k, v in r.items() if _number(v) and k not in ("step", "time")}

    @property
    def final_val_loss(self) -> float:
        finish = self.last("finish") or {}
        return float(finish["val_loss"]) if _number(finish.get("val_loss")) else math.nan

    def curve(self, name: str) -> tuple[list[int], list[float]]:
        """Each step's value once: a step re-run after a resume or rollback has the re-run's."""
        points = [(r["step"], r[name]) for r in current(self.records) if r.get("type") == "metrics" and name in r]
        return [s for s, _ in points], [v for _, v in points]

    def evals(self) -> tuple[list[int], list[float]]:
        points = [(r["step"], r["val_loss"]) for r in current(self.records) if r.get("type") == "eval"]
        return [s for s, _ in points], [v for _, v in points]

    def experiment_key(self) -> tuple:
        """What the run computes, seeds aside: runs with the same key are seeds of one experiment."""
        return tuple(sorted((k, str(v)) for k, v in self.config.items() if k not in SEED_KEYS and not k.startswith(IRRELEVANT_PREFIXES)))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def load_run(path: Path) -> Run:
    """A run folder, read as untrusted files: its resolved.yaml with bounded work (weights.read_yaml_mapping, a
    ConfigError naming what is wrong) and its journal with damaged lines skipped (Run.skipped names them)."""
    path = Path(path)
    config = read_yaml_mapping(path / RESOLVED) if (path / RESOLVED).is_file() else {}
    return Run(path, flatten(config), read_journal(path / JOURNAL))


def find_runs(location: str | Path, skipped: list[str] | None = None) -> list[Run]:
    """The run folder at `location`, or every run folder below it (a multirun or sweep folder), in path order.
    Below a folder, a run whose config cannot be read is left out, and said in `skipped` (if given)."""
    location = Path(location).expanduser()
    if (location / JOURNAL).is_file():
        return [load_run(location)]
    if not location.is_dir():
        raise ConfigError(f"{location} does not exist: pass a run folder (with {JOURNAL}) or a multirun/sweep folder")
    runs = []
    for journal in sorted(location.rglob(JOURNAL)):
        try:
            runs.append(load_run(journal.parent))
        except ConfigError as error:
            if skipped is None:
                raise
            skipped.append(str(error))
    if not runs and not skipped:
        raise ConfigError(f"{location} holds no run folder (no {JOURNAL} below it): pass a run, multirun or sweep folder")
    if not runs:
        raise ConfigError(f"{location} holds no run folder whose config reads ({'; '.join(skipped or [])}): pass a run, multirun or sweep folder")
    return runs
