"""The search space: `params` entries (Hydra's sweep syntax) to Optuna distributions, and back to overrides.

Each entry is parsed by Hydra's own override parser, so `interval`, `choice`, `range`, `tag(log, ...)` and
casts (`int(interval(1, 8))`) mean what they mean on Hydra's command line. Unlike hydra-optuna-sweeper 1.3,
`range(start, stop, step)` excludes stop, as Python's range and Hydra's basic sweeper do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SYNTAX = "interval(low, high), int(interval(low, high)), tag(log, interval(low, high)), choice(a, b, ...) or range(start, stop[, step])"


@dataclass(frozen=True)
class Dimension:
    """One swept key, torch- and optuna-free so validation can check it: kind is float, int or categorical."""

    kind: str
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def distribution(self) -> Any:
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "categorical":
            return CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)

    def grid(self) -> list[Any]:
        """The values GridSampler walks: choices, or the points of a range."""
        if self.kind == "categorical":
            return list(self.choices)
        if self.step is None:
            raise ValueError("an interval has no grid")
        count = int(round((self.high - self.low) / self.step)) + 1
        return [self.low + index * self.step for index in range(count)]


@dataclass
class SearchSpace:
    dimensions: dict[str, Dimension] = field(default_factory=dict)
    fixed: dict[str, str | None] = field(default_factory=dict)
    """Plain `key: value` entries: passed unchanged to every trial (value None: a `~key` deletion)."""

    def grid(self) -> dict[str, list[Any]]:
        return {key: dim.grid() for key, dim in self.dimensions.items()}


def _encode(value: Any) -> Any:
    from hydra.core.override_parser.types import Transformer

    return Transformer.encode(value) if not isinstance(value, (int, float, bool, type(None))) else value


def _interval(key: str, value: Any) -> Dimension:
    is_int = isinstance(value.start, int) and isinstance(value.end, int)
    log = "log" in value.tags
    if not value.start < value.end:
        raise ValueError(f"the interval is empty (low {value.start} is not below high {value.end})")
    if log and not value.start > 0:
        raise ValueError(f"a log interval needs a positive low bound, got {value.start}")
    return Dimension("int" if is_int else "float", value.start, value.end, log=log)


def _range(key: str, value: Any) -> Dimension:
    start, stop, step = value.start, value.stop, value.step
    if not step or (stop - start) / step <= 0:
        raise ValueError(f"range({start}, {stop}, {step}) holds no value (stop is excluded, as in Python)")
    # The values start, start+step, ... strictly below stop; the tolerance keeps float steps (0.1) exact.
    count = math.ceil((stop - start) / step - 1e-9)
    last = start + (count - 1) * step
    if value.shuffle:
        return Dimension("categorical", choices=tuple(start + index * step for index in range(count)))
    is_int = all(isinstance(v, int) for v in (start, stop, step))
    return Dimension("int" if is_int else "float", start, last, step=step)


def _dimension(key: str, override: Any) -> Dimension:
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    value = override.value()
    if isinstance(value, IntervalSweep):
        return _interval(key, value)
    if isinstance(value, RangeSweep):
        return _range(key, value)
    if isinstance(value, ChoiceSweep):
        choices = tuple(_encode(choice) for choice in override.sweep_iterator())
        if not choices:
            raise ValueError("choice() is empty")
        return Dimension("categorical", choices=choices)
    raise ValueError(f"{type(value).__name__} sweeps are not supported")


def parse_entry(key: str, text: str) -> tuple[Dimension | None, str | None]:
    """(dimension, None) for a sweep, (None, fixed value) for a plain value; raises ValueError if malformed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        override = OverridesParser.create().parse_override(f"{key}={text}")
    except HydraException as error:
        raise ValueError(" ".join(str(error).split())) from None
    if not override.is_sweep_override():
        return None, override.get_value_element_as_str()
    return _dimension(key, override), None


def parse_params(params: Mapping[str, Any], path: str) -> tuple[SearchSpace, list[str]]:
    """The search space of `params`, and a problem per malformed entry (naming `path.key` and the syntax)."""
    space, problems = SearchSpace(), []
    for key, text in params.items():
        entry = "null" if text is None else (str(text).lower() if isinstance(text, bool) else str(text))
        try:
            dimension, fixed = parse_entry(str(key), entry)
        except ValueError as error:
            problems.append(f"{path}.{key}={entry}: {error}. Write one of {SYNTAX}")
            continue
        if dimension is None:
            space.fixed[str(key)] = fixed
        else:
            space.dimensions[str(key)] = dimension
    return space, problems


def overrides_of(params: Mapping[str, Any]) -> list[str]:
    """A trial's sampled values as Hydra overrides (strings quoted so that Hydra reads them back unchanged)."""
    return [f"{key}={_override_value(value)}" for key, value in params.items()]


def _override_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, str):
        from hydra.core.override_parser.overrides_parser import OverridesParser

        try:  # a value Hydra reads back as the same string needs no quotes (model=gqa, a path)
            if OverridesParser.create().parse_override(f"k={value}").value() == value:
                return value
        except Exception:
            pass
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)
