"""Tables of features and a class label (data=digits, data=table), through the leakage-safe pipeline.

Rows are split first (pipeline.split_rows), the normaliser is fitted on the train rows alone
(pipeline.fit_on_train), then every split is held as float32 features and int64 labels. A batch is a
pure function of (seed, split, step, microbatch): train batches are seeded random draws of distinct rows,
val and test batches walk the split in order (microbatch k holds rows k*batch_size onward, wrapping), so
trainer.eval_batches * trainer.batch_size >= the val rows evaluates every val row. Data-parallel ranks
take disjoint slices of the one global batch, as the token corpora do.

The model sees (batch, features) float inputs and (batch,) labels; seq_len is 1 (one target per row),
so the trainer's tokens/s counts rows/s.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from currytrain.data.base import stable_seed
from currytrain.data.pipeline import Leak, Split, fit_on_train, leakage_report, split_rows
from currytrain.errors import ConfigError

log = logging.getLogger(__name__)


def _standard_scaler() -> Any:
    try:
        from sklearn.preprocessing import StandardScaler
    except ImportError:
        raise ConfigError("data.normalize=true uses scikit-learn's StandardScaler: pip install 'currytrain[tabular]', or pass data.normalize=false") from None
    return StandardScaler()


class _Identity:
    """normalize=false: no transform (nothing is fitted, so nothing can leak)."""

    def fit(self, x: np.ndarray) -> _Identity:
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        return x


class TabularData:
    """Features and class labels, split and normalised by the pipeline, batched by seed (see the module docstring)."""

    seq_len = 1
    """One target per row: the trainer's token counts are row counts."""

    def __init__(self, features: np.ndarray, labels: np.ndarray, split: Split, seed: int, normalize: bool = True, names: list[str] | None = None):
        self.seed, self.split, self.names = seed, split, names
        self.raw_train = np.asarray(features[split.train], dtype=np.float64)
        self.transform = _standard_scaler() if normalize else _Identity()
        parts = fit_on_train(self.transform, np.asarray(features, dtype=np.float64), split)
        self.x = {name: torch.as_tensor(part, dtype=torch.float32) for name, part in parts.items()}
        self.y = {name: torch.as_tensor(labels[split.parts()[name]], dtype=torch.int64) for name in parts}
        self.num_features = features.shape[1]
        self.num_classes = int(labels.max()) + 1

    def batch(self, split: str, step: int, micro: int, batch_size: int, rank: int = 0, num_ranks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Features (batch_size // num_ranks, num_features) and labels (batch_size // num_ranks,) of rank `rank`'s slice."""
        if not 0 <= rank < num_ranks or batch_size % num_ranks:
            raise ValueError(f"rank {rank} of {num_ranks}: the global batch of {batch_size} rows must split evenly")
        if split not in self.x:
            raise ValueError(f"this table has no {split} split (data.test_fraction=0?)")
        num_rows = len(self.y[split])
        if split == "train":
            generator = torch.Generator().manual_seed(stable_seed(self.seed, split, step, micro, 0))
            rows = (
                torch.randperm(num_rows, generator=generator)[:batch_size]
                if batch_size <= num_rows
                else torch.randint(num_rows, (batch_size,), generator=generator)
            )
        else:
            rows = (micro * batch_size + torch.arange(batch_size)) % num_rows
        share = batch_size // num_ranks
        rows = rows[rank * share : (rank + 1) * share]
        return self.x[split][rows], self.y[split][rows]

    def eval_metrics(self, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """Metrics the trainer averages over its val batches, besides the loss."""
        return {"accuracy": float((logits.argmax(-1) == targets).float().mean())}

    def leakage_report(self, **thresholds: Any) -> list[Leak]:
        """pipeline.leakage_report on this table: overlap between splits, target-encoding features, and
        whether the normaliser equals one fitted on the train rows alone."""
        splits = {name: (self.x[name].numpy(), self.y[name].numpy()) for name in self.x}
        transforms = (self.transform,) if not isinstance(self.transform, _Identity) else ()
        return leakage_report(splits, self.raw_train, transforms, names=self.names, **thresholds)

    def describe(self) -> dict:
        sizes = {f"{name}_rows": len(labels) for name, labels in self.y.items()}
        return {**sizes, "features": self.num_features, "classes": self.num_classes}


class Digits(TabularData):
    """scikit-learn's handwritten digits (1797 8x8 images, 10 classes), shipped inside the package: no download."""

    def __init__(self, val_fraction: float = 0.2, test_fraction: float = 0.0, normalize: bool = True, seed: int = 0):
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise ConfigError("data=digits reads scikit-learn's bundled digits: pip install 'currytrain[tabular]'") from None
        digits = load_digits()
        split = split_rows("random", len(digits.target), val_fraction, test_fraction, seed)
        super().__init__(digits.data, digits.target, split, seed, normalize, names=list(digits.feature_names))
        log.info("digits: %s", self.describe())


def read_table(path: str) -> Any:
    """A pyarrow Table from a .csv, .parquet or .jsonl file (the `parquet` extra), or a ConfigError naming the file."""
    try:
        import pyarrow.csv
        import pyarrow.json
        import pyarrow.parquet
    except ImportError:
        raise ConfigError(f"data.path={path} is read with pyarrow: pip install 'currytrain[parquet]'") from None
    file = Path(path).expanduser()
    readers = {".csv": pyarrow.csv.read_csv, ".parquet": pyarrow.parquet.read_table, ".jsonl": pyarrow.json.read_json}
    if file.suffix not in readers:
        raise ConfigError(f"data.path={path} is not a .csv, .parquet or .jsonl file: convert it, or pass one of those")
    try:
        return readers[file.suffix](file)
    except Exception as error:  # pyarrow raises ArrowInvalid/OSError subclasses for unreadable files
        raise ConfigError(f"data.path={path} cannot be read ({type(error).__name__}: {error}): fix or replace the file") from None


def _column(table: Any, name: str, key: str) -> np.ndarray:
    if name not in table.column_names:
        raise ConfigError(f"{key}={name}: the table has no such column (it has {table.column_names[:12]}): pass {key}=<a column>")
    return table.column(name).to_numpy(zero_copy_only=False)


class TableFile(TabularData):
    """A table of the user's (CSV, Parquet, JSON lines): numeric feature columns, an integer class column, and
    optionally a group or time column that decides the split (data.split=grouped|temporal)."""

    def __init__(
        self,
        path: str,
        target: str,
        features: list[str] = (),
        split: str = "random",
        group_column: str = "",
        time_column: str = "",
        val_fraction: float = 0.2,
        test_fraction: float = 0.0,
        normalize: bool = True,
        seed: int = 0,
    ):
        table = read_table(path)
        labels = _column(table, target, "data.target")
        if labels.dtype.kind not in "iu" or len(labels) == 0 or labels.min() < 0:
            raise ConfigError(f"data.target={target} must hold class ids 0..C-1 (non-negative integers), it holds {labels.dtype}: encode the classes first")
        reserved = {target, group_column, time_column} - {""}
        names = list(features) or [name for name in table.column_names if name not in reserved]
        columns = [_column(table, name, "data.features") for name in names]
        for name, column in zip(names, columns):
            if column.dtype.kind not in "iufb":
                raise ConfigError(f"data.features: column {name} holds {column.dtype}, not numbers: encode it first, or leave it out of data.features")
        groups = _column(table, group_column, "data.group_column") if split == "grouped" else None
        times = _column(table, time_column, "data.time_column") if split == "temporal" else None
        try:
            rows = split_rows(split, len(labels), val_fraction, test_fraction, seed, groups=groups, times=times)
        except ValueError as error:
            raise ConfigError(f"data.path={path}: {error}") from None
        super().__init__(np.stack(columns, axis=1).astype(np.float64), labels.astype(np.int64), rows, seed, normalize, names=names)
