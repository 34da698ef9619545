"""Finding the user's text files (torch-free: validation calls it before anything is written)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable


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
    return files, problems
