"""The leakage-safe pipeline for general (non-LM) data: split first, fit on train only, shuffle by seed, check.

The order is fixed: split the raw rows (random, grouped or temporal) before anything looks at them, fit every
transform on the train rows alone, apply it to every split, then draw batches by seed. leakage_report()
checks a result for the ways this goes wrong: rows shared by two splits (exactly or nearly), a feature
that encodes the target, a transform fitted on more than the train rows.

Transforms are anything with scikit-learn's fit/transform interface (StandardScaler, OrdinalEncoder, a
Pipeline of them, or a class of your own whose fitted state sits in attributes ending in `_`, as
scikit-learn's do). This module needs numpy and scipy only.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from currytrain.data.config import SPLIT_KINDS


class Transform(Protocol):
    """scikit-learn's transformer interface: fit on some rows, then transform any rows."""

    def fit(self, x: np.ndarray) -> Any: ...
    def transform(self, x: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class Split:
    """Row indices of each split, sorted; no row is in two of them."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray

    def parts(self) -> dict[str, np.ndarray]:
        return {"train": self.train, "val": self.val, "test": self.test}


def _held_out(num: int, val_fraction: float, test_fraction: float) -> tuple[int, int]:
    """(val, test) sizes: their shares of `num`, at least one each when the share is positive."""
    num_val = max(1, round(num * val_fraction)) if val_fraction > 0 else 0
    num_test = max(1, round(num * test_fraction)) if test_fraction > 0 else 0
    if num_val + num_test >= num:
        raise ValueError(f"{num} rows (or groups, or timestamps) cannot fill train, val and test: add data or lower data.val_fraction/data.test_fraction")
    return num_val, num_test


def random_split(num_rows: int, val_fraction: float, test_fraction: float = 0.0, seed: int = 0) -> Split:
    """Rows assigned by a seeded permutation: val first, then test, the rest is train."""
    num_val, num_test = _held_out(num_rows, val_fraction, test_fraction)
    order = np.random.default_rng(seed).permutation(num_rows)
    return Split(np.sort(order[num_val + num_test :]), np.sort(order[:num_val]), np.sort(order[num_val : num_val + num_test]))


def grouped_split(groups: np.ndarray, val_fraction: float, test_fraction: float = 0.0, seed: int = 0) -> Split:
    """Whole groups (a patient, a user, a document) assigned by a seeded permutation of the groups, so no group
    has rows in two splits; the fractions are shares of the groups, not of the rows."""
    names, codes = np.unique(np.asarray(groups), return_inverse=True)
    held = random_split(len(names), val_fraction, test_fraction, seed)
    return Split(*(np.flatnonzero(np.isin(codes, part)) for part in (held.train, held.val, held.test)))


def temporal_split(times: np.ndarray, val_fraction: float, test_fraction: float = 0.0) -> Split:
    """The earliest timestamps train, the next validate, the latest test. The fractions are shares of the
    distinct timestamps and each timestamp lies in one split, so every train row is strictly earlier than
    every val row, and every val row than every test row. No seed: the order is time's."""
    stamps, codes = np.unique(np.asarray(times), return_inverse=True)
    num_val, num_test = _held_out(len(stamps), val_fraction, test_fraction)
    first_val, first_test = len(stamps) - num_val - num_test, len(stamps) - num_test
    rows = np.arange(len(codes))
    return Split(rows[codes < first_val], rows[(codes >= first_val) & (codes < first_test)], rows[codes >= first_test])


def split_rows(kind: str, num_rows: int, val_fraction: float, test_fraction: float, seed: int, groups=None, times=None) -> Split:
    """The split of data.split=`kind`; grouped needs `groups`, temporal needs `times` (one value per row)."""
    if kind == "random":
        return random_split(num_rows, val_fraction, test_fraction, seed)
    if kind == "grouped":
        return grouped_split(groups, val_fraction, test_fraction, seed)
    if kind == "temporal":
        return temporal_split(times, val_fraction, test_fraction)
    raise ValueError(f"data.split={kind} is not one of {list(SPLIT_KINDS)}")


def fit_on_train(transform: Transform, x: np.ndarray, split: Split) -> dict[str, np.ndarray]:
    """Fit `transform` on the train rows of `x` alone, then transform each split: the one place that fits."""
    transform.fit(x[split.train])
    return {name: transform.transform(x[rows]) for name, rows in split.parts().items() if len(rows)}


def shuffled(num_rows: int, seed: int) -> np.ndarray:
    """A permutation of the rows determined by `seed` alone (callers derive the seed from seed, split, step...)."""
    return np.random.default_rng(seed).permutation(num_rows)


# ------------------------------------------------------------------------------------------ leakage detector


@dataclass
class Leak:
    """One check of leakage_report: what it saw, and when leaked, why and what to change."""

    check: str
    leaked: bool
    observed: str
    expected: str
    """What a leak-free split gives (the threshold)."""
    cause: str = ""
    fix: str = ""


def fitted_state(transform: Any) -> dict[str, Any]:
    """What fitting set: scikit-learn's convention, the attributes ending in `_` (not dunder ones)."""
    return {key: value for key, value in vars(transform).items() if key.endswith("_") and not key.startswith("__")}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind in "fc" and b.dtype.kind in "fc":
            return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-6, atol=1e-9, equal_nan=True))
        return a.shape == b.shape and bool((a == b).all())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def fitted_on_train_only(transform: Any, train_x: np.ndarray) -> Leak:
    """Refit a copy of `transform` on the train rows: a transform fitted on train only has the same state;
    one fitted on train + val (the classic normaliser leak) does not."""
    state, expected = fitted_state(transform), "the fitted state of a refit on the train rows alone"
    if not state:
        return Leak("transform fitted on train only", False, f"{type(transform).__name__} has no fitted state (attributes ending in _) to compare", expected)
    refit = fitted_state(copy.deepcopy(transform).fit(train_x))
    differing = sorted(key for key in state if key not in refit or not _same(state[key], refit[key]))
    if differing:
        return Leak(
            "transform fitted on train only",
            True,
            f"{type(transform).__name__}.{', '.join(differing)} differ from a refit on the {len(train_x)} train rows",
            expected,
            "the transform was fitted on rows outside the train split (the whole dataset?): val statistics leak into training",
            "fit transforms on the train split alone (currytrain.data.pipeline.fit_on_train)",
        )
    return Leak("transform fitted on train only", False, f"{type(transform).__name__} equals a refit on the {len(train_x)} train rows", expected)


def _row_keys(x: np.ndarray) -> set[bytes]:
    rows = np.ascontiguousarray(np.asarray(x, dtype=np.float64))
    return {row.tobytes() for row in rows}


def duplicate_rows(train_x: np.ndarray, other_x: np.ndarray, name: str, near_distance: float, max_share: float) -> list[Leak]:
    """Rows of `other_x` that occur in train exactly, or within `near_distance` (root-mean-square difference per
    feature, in units of the train standard deviation) of a train row."""
    from scipy.spatial import cKDTree

    train_x, other_x = np.asarray(train_x, dtype=np.float64), np.asarray(other_x, dtype=np.float64)
    exact = len(_row_keys(train_x) & _row_keys(other_x))
    scale = train_x.std(axis=0)
    scale[scale == 0] = 1.0
    distances, _ = cKDTree(train_x / scale).query(other_x / scale, k=1)
    near = int((distances / np.sqrt(train_x.shape[1]) <= near_distance).sum())
    leaks = []
    for kind, count in (("exact", exact), ("near", near)):
        share = count / max(len(other_x), 1)
        observed = f"{count} of {len(other_x)} {name} rows ({share:.1%}) have {'an' if kind == 'exact' else 'a'} {kind} duplicate in train" + (
            f" (within {near_distance:g} train std per feature)" if kind == "near" else ""
        )
        leaked = share > max_share
        cause = f"{name} repeats training rows: its score measures memory, not generalisation" if leaked else ""
        fix = "deduplicate before splitting, or split by group (data.split=grouped) so copies stay together" if leaked else ""
        leaks.append(Leak(f"{kind} duplicates train/{name}", leaked, observed, f"share <= {max_share:g}", cause, fix))
    return leaks


def single_feature_accuracy(train_x: np.ndarray, train_y: np.ndarray, val_x: np.ndarray, val_y: np.ndarray) -> np.ndarray:
    """For each feature: the val accuracy of predicting the class from that feature alone, as the class of
    the train row with the nearest value (1-nearest-neighbour on one column)."""
    scores = np.zeros(train_x.shape[1])
    for feature in range(train_x.shape[1]):
        order = np.argsort(train_x[:, feature], kind="stable")
        values, labels = train_x[order, feature], train_y[order]
        right = np.clip(np.searchsorted(values, val_x[:, feature]), 0, len(values) - 1)
        left = np.clip(right - 1, 0, len(values) - 1)
        nearest = np.where(np.abs(values[left] - val_x[:, feature]) < np.abs(values[right] - val_x[:, feature]), left, right)
        scores[feature] = (labels[nearest] == val_y).mean()
    return scores


def target_encoding_features(train_x, train_y, val_x, val_y, threshold: float, names: list[str] | None = None) -> Leak:
    """A feature that alone predicts the val class almost always (>= threshold) is the target in disguise
    (an id sorted by label, a post-outcome field), unless the majority class alone does as well."""
    train_y, val_y = np.asarray(train_y).astype(np.int64), np.asarray(val_y).astype(np.int64)
    scores = single_feature_accuracy(np.asarray(train_x), train_y, np.asarray(val_x), val_y)
    baseline = np.bincount(val_y).max() / len(val_y)
    suspects = [int(i) for i in np.flatnonzero((scores >= threshold) & (scores > baseline))]
    label = (lambda i: names[i]) if names else (lambda i: f"feature {i}")
    best = int(scores.argmax())
    expected = f"no single feature predicts >= {threshold:.0%} of val classes"
    observed = f"best single feature ({label(best)}) predicts {scores[best]:.1%} of val classes (majority class: {baseline:.1%})"
    if suspects:
        return Leak(
            "no feature encodes the target",
            True,
            observed,
            expected,
            f"{', '.join(label(i) for i in suspects[:4])} alone predict(s) the target: it is derived from the label",
            "drop the feature (data.features), or check how it was recorded",
        )
    return Leak("no feature encodes the target", False, observed, expected)


def leakage_report(
    splits: dict[str, tuple[np.ndarray, np.ndarray]],
    raw_train_x: np.ndarray | None = None,
    transforms: tuple[Any, ...] = (),
    *,
    near_distance: float = 0.05,
    max_duplicate_share: float = 0.0,
    target_threshold: float = 0.99,
    classification: bool = True,
    names: list[str] | None = None,
) -> list[Leak]:
    """Every leakage check of a split dataset: `splits` maps train/val/test to (features, targets) as the model
    sees them; `raw_train_x` are the train features before `transforms`, which each must equal a refit on them."""
    train_x, train_y = splits["train"]
    leaks = [fitted_on_train_only(transform, raw_train_x) for transform in transforms]
    for name, (x, _) in splits.items():
        if name != "train" and len(x):
            leaks += duplicate_rows(train_x, x, name, near_distance, max_duplicate_share)
    if classification and "val" in splits:
        leaks.append(target_encoding_features(train_x, train_y, *splits["val"], target_threshold, names))
    return leaks
