"""The search space: `params` entries (Hydra's sweep syntax) to Optuna distributions, and back to overrides.

Each entry is parsed by Hydra's own override parser, so `interval`, `choice`, `range`, `tag(log, ...)` and
casts (`int(interval(1, 8))`) mean what they mean on Hydra's command line. Unlike hydra-optuna-sweeper 1.3,
`range(start, stop, step)` excludes stop, as Python's range and Hydra's basic sweeper do. The deprecated
`search_space` form of that plugin (`{type, low, high, step, log, choices}` per key, bounds included) is read
by parse_search_space.
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
    custom: str | None = None
    """`custom_search_space`: the dotted path of a function (cfg, trial) that suggests more parameters."""

    def set(self, key: str, dimension: Dimension | None, fixed: str | None) -> None:
        """Sweep or fix `key`, replacing whatever an earlier entry said about it (the command line wins)."""
        self.dimensions.pop(key, None)
        self.fixed.pop(key, None)
        if dimension is None:
            self.fixed[key] = fixed
        else:
            self.dimensions[key] = dimension

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
        space.set(str(key), dimension, fixed)
    return space, problems


LEGACY_TYPES = ("int", "float", "categorical")


def _legacy_dimension(entry: Mapping[str, Any]) -> Dimension:
    """One entry of the deprecated search_space form: its bounds are inclusive, as that plugin had them."""
    unknown = sorted(set(entry) - {"type", "low", "high", "step", "log", "choices"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}: the fields are type, low, high, step, log, choices")
    kind = str(entry.get("type"))
    if kind not in LEGACY_TYPES:
        raise ValueError(f"type={entry.get('type')} is not one of {list(LEGACY_TYPES)}")
    if kind == "categorical":
        if not entry.get("choices"):
            raise ValueError("a categorical entry needs a non-empty choices list")
        return Dimension("categorical", choices=tuple(entry["choices"]))
    low, high, step, log = entry.get("low"), entry.get("high"), entry.get("step"), bool(entry.get("log", False))
    if low is None or high is None or not low < high:
        raise ValueError(f"low={low} and high={high} must be numbers with low < high")
    if log and not low > 0:
        raise ValueError(f"a log entry needs a positive low bound, got {low}")
    if kind == "int":
        return Dimension("int", int(low), int(high), step=None if log else int(step or 1), log=log)
    return Dimension("float", float(low), float(high), step=None if log or step is None else float(step), log=log)


def parse_search_space(entries: Mapping[str, Any], path: str) -> tuple[dict[str, Dimension], list[str]]:
    """The dimensions of hydra-optuna-sweeper's deprecated `search_space` form, and a problem per bad entry."""
    dimensions, problems = {}, []
    for key, entry in entries.items():
        try:
            if not isinstance(entry, Mapping):
                raise ValueError("each entry is a mapping such as {type: float, low: 0.0, high: 1.0}")
            dimensions[str(key)] = _legacy_dimension(entry)
        except ValueError as error:
            problems.append(f"{path}.{key}: {error}. Better: move it to params, e.g. {key}: interval(low, high)")
    return dimensions, problems


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
