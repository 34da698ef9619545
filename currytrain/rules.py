"""Small, torch-free helpers that config checks share. Each option's `check(node, path)` lives beside its
dataclass and returns problems as "key=value what is wrong: the fix" strings; validate.py collects them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def at_least(node: Any, path: str, keys: Iterable[str], minimum: int = 1) -> list[str]:
    """Every key in `keys` that is present and below `minimum` (NaN counts as below)."""
    return [f"{path}.{key}={node[key]} must be >= {minimum}: pass {path}.{key}=<int >= {minimum}>" for key in keys if key in node and not node[key] >= minimum]


def positive(node: Any, path: str, key: str, example: Any) -> list[str]:
    """key must be > 0 (and not NaN): the fix suggests `example`."""
    return [] if node[key] > 0 else [f"{path}.{key}={node[key]} must be > 0: pass {path}.{key}={example}"]


def one_of(node: Any, path: str, key: str, options: Sequence[str], fix: str | None = None) -> list[str]:
    """key must be one of `options`; the fix suggests `fix`, by default the first option."""
    if node[key] in options:
        return []
    return [f"{path}.{key}={node[key]} is not one of {list(options)}: pass {path}.{key}={fix or options[0]}"]
