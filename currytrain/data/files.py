"""Finding the user's text files (torch-free: validation calls it before anything is written)."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


def find_text_files(paths: Iterable[str], suffixes: Iterable[str]) -> tuple[list[Path], list[str]]:
    """The non-empty files that data.paths names, and one problem message per entry that yields none."""
    paths, suffixes = list(paths), tuple(suffixes)
    if not paths:
        return [], ["data.paths is empty: pass data.paths=[/path/to/file_or_folder]"]
    files: list[Path] = []
    problems: list[str] = []
    for entry in paths:
        path = Path(entry).expanduser()
        if not path.exists():
            problems.append(f"data.paths: {entry} does not exist: pass an existing file or folder")
            continue
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
        found = [p for p in found if p.stat().st_size > 0]
        if not found:
            problems.append(f"data.paths: {entry} holds no non-empty file ending in {list(suffixes)}: check the path or data.suffixes")
        files.extend(found)
    # Entries may overlap (a folder and a file inside it): each file once, or it could land in train and val.
    unique = {path.resolve(): path for path in files}
    return list(unique.values()), problems


SNIFF_BYTES = 4096


def not_text(path: Path) -> str | None:
    """Why `path` cannot feed data=text (unreadable, or binary: NUL bytes or invalid UTF-8 in its first
    4 KiB), or None. A model trained on random bytes only learns the uniform loss, silently."""
    try:
        with path.open("rb") as handle:
            head = handle.read(SNIFF_BYTES)
    except OSError as error:
        return f"{path} cannot be read ({error.strerror}): make it readable, or leave it out of data.paths"
    try:
        head.decode("utf-8")
        binary = b"\0" in head
    except UnicodeDecodeError as error:
        binary = error.start < len(head) - 3  # a character cut by the 4 KiB boundary is not binary
    if binary:
        return f"{path} is not UTF-8 text (binary bytes in its first {SNIFF_BYTES} bytes): leave it out of data.paths, or narrow data.suffixes"
    return None


def split_files(files: list[Path], val_fraction: float, seed: int) -> tuple[list[Path], list[Path]]:
    """Hold out whole files for validation, chosen by a seeded shuffle of the sorted list."""
    order = sorted(files)
    random.Random(seed).shuffle(order)
    num_val = max(1, round(len(order) * val_fraction))
    return order[num_val:], order[:num_val]


@dataclass
class SplitPlan:
    """Which files feed train and val, and how many bytes each may take (0: all of them)."""

    train_files: list[Path]
    val_files: list[Path]
    train_budget: int
    val_budget: int
    single_file_cut: float | None
    """For one file (which cannot be split by file): the fraction of its bytes that is train."""


def plan_split(files: list[Path], val_fraction: float, max_bytes: int, seed: int) -> SplitPlan:
    """Whole files held out for val, a val_fraction share of the files; where their bytes are far from that share of
    the bytes (a few files of very different sizes), files chosen by size instead; where no set of whole files comes
    near it (one file, or two of equal size), the last val_fraction of the bytes."""
    if len(files) == 1:
        return SplitPlan(files, files, max_bytes, 0, single_file_cut=1 - val_fraction)
    train_files, val_files = split_files(files, val_fraction, seed)
    if not _near_share(val_files, files, val_fraction):
        val_files = _held_out_by_size(files, val_fraction, seed)
        if val_files is None:
            return SplitPlan(files, files, max_bytes, 0, single_file_cut=1 - val_fraction)
        train_files = [path for path in files if path not in set(val_files)]
    # The byte budget is shared in proportion to the split so val stays a val_fraction share.
    train_budget = int(max_bytes * (1 - val_fraction)) if max_bytes else 0
    val_budget = max_bytes - train_budget if max_bytes else 0
    return SplitPlan(train_files, val_files, train_budget, val_budget, single_file_cut=None)


def _near_share(val_files: list[Path], files: list[Path], val_fraction: float) -> bool:
    """Whether val_files hold between half and twice val_fraction of the bytes of files (and at most half)."""
    total = sum(path.stat().st_size for path in files)
    share = sum(path.stat().st_size for path in val_files) / total if total else val_fraction
    return val_fraction / 2 <= share <= min(2 * val_fraction, 0.5)


def _held_out_by_size(files: list[Path], val_fraction: float, seed: int) -> list[Path] | None:
    """Files in a seeded shuffle, each taken for val when it keeps val within twice its share of the bytes, until
    val holds its share; None when what it gathers is not near the share."""
    order = sorted(files)
    random.Random(seed).shuffle(order)
    sizes = {path: path.stat().st_size for path in order}
    target, held, val = val_fraction * sum(sizes.values()), 0, []
    for path in order:
        if held >= target:
            break
        if held + sizes[path] <= 2 * target:
            val.append(path)
            held += sizes[path]
    return val if val and len(val) < len(files) and _near_share(val, files, val_fraction) else None


def planned_sizes(plan: SplitPlan) -> tuple[int, int]:
    """The (train, val) byte counts a plan yields, from file sizes alone (nothing is read)."""

    def size(group: list[Path], budget: int) -> int:
        total = sum(p.stat().st_size for p in group)
        return min(total, budget) if budget else total

    if plan.single_file_cut is not None:
        total = size(plan.train_files, plan.train_budget)
        cut = int(total * plan.single_file_cut)
        return cut, total - cut
    return size(plan.train_files, plan.train_budget), size(plan.val_files, plan.val_budget)


def table_columns(path: Path) -> tuple[list[str], str | None]:
    """The column names of a .csv, .parquet or .jsonl table, read from its header alone (validation runs this
    before anything is written), or a problem naming data.path."""
    import json

    try:
        if path.suffix == ".jsonl":
            with path.open(encoding="utf-8") as lines:
                first = next((line for line in lines if line.strip()), "{}")
            record = json.loads(first)
            return (list(record) if isinstance(record, dict) else []), None
        import pyarrow.csv
        import pyarrow.parquet

        if path.suffix == ".parquet":
            return pyarrow.parquet.read_schema(path).names, None
        with pyarrow.csv.open_csv(path) as reader:  # streams: reads the first block only
            return reader.schema.names, None
    except ImportError:
        return [], f"data.path={path} is read with pyarrow: pip install 'currytrain[parquet]'"
    except Exception as error:  # JSON, Arrow and OS errors alike: the file cannot be read as a table
        return [], f"data.path={path} cannot be read as a table ({type(error).__name__}: {error}): fix or replace the file"
