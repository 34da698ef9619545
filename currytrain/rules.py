"""Small, torch-free helpers that config checks share. A field's range is declared with the field
(`bounded(default, gt=0)`) and checked for every schema by schema_problems; what spans fields lives in each
option's `check(node, path) -> list[str]` beside its dataclass. Problems are "key=value what is wrong: the fix"
strings; validate.py collects them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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


def inside_run_folder(node: Any, path: str, key: str, example: str) -> list[str]:
    """key names a file or folder inside the run folder: not empty, not absolute, not climbing out with `..`
    (a run writes only into its own folder)."""
    value = str(node[key])
    parts = value.replace("\\", "/").split("/")
    if not value.strip() or value.startswith(("/", "~")) or ".." in parts or value.strip() in (".", "./"):
        return [f"{path}.{key}={value!r} must name a file or folder inside the run folder: pass {path}.{key}={example}"]
    return []


# ------------------------------------------------------------------------------------ ranges in the schema

BOUNDS = "currytrain.bounds"
"""The dataclass field metadata key under which bounded() declares a field's range."""
FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: a float field beyond it trains (or is compared) as inf."""


@dataclass(frozen=True)
class Bounds:
    """The values a numeric field (or each number of a list field) may take; None leaves that side open."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    nonfinite: bool = False
    """The field documents inf or nan as meaningful (no built-in field does)."""
    example: Any = None
    """The value the fix suggests ("{dim}": the node's own dim); None suggests the field's default."""

    def holds(self, value: float) -> bool:
        return not (
            (self.ge is not None and not value >= self.ge)
            or (self.gt is not None and not value > self.gt)
            or (self.le is not None and not value <= self.le)
            or (self.lt is not None and not value < self.lt)
        )

    def describe(self) -> str:
        """'> 0', '>= 1', 'in (0, 1]', or '' when unbounded."""
        low = f"{_num(self.ge)}" if self.ge is not None else f"{_num(self.gt)}" if self.gt is not None else None
        high = f"{_num(self.le)}" if self.le is not None else f"{_num(self.lt)}" if self.lt is not None else None
        if low is not None and high is not None:
            return f"in {'[' if self.ge is not None else '('}{low}, {high}{']' if self.le is not None else ')'}"
        if low is not None:
            return f"{'>=' if self.ge is not None else '>'} {low}"
        if high is not None:
            return f"{'<=' if self.le is not None else '<'} {high}"
        return ""


def _num(value: float) -> str:
    if isinstance(value, int) and value >= 2**20 and value & (value - 1) == 0:
        return f"2**{value.bit_length() - 1}"
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else str(value)


def bounded(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    nonfinite: bool = False,
    example: Any = None,
) -> Any:
    """A dataclass field with its range: `init_std: float = bounded(0.02, gt=0)`. Validation (schema_problems)
    refuses values outside it, and, for float fields, nan and inf unless nonfinite=True; the fix suggests
    `example` or the default."""
    metadata = {BOUNDS: Bounds(ge, gt, le, lt, nonfinite, example)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declared_bounds(schema: type, name: str) -> Bounds:
    """The field's Bounds, from the nearest class that declares them: a subclass that only changes a default
    (`max_bytes: int = 16_000_000`) keeps its base class's range."""
    for klass in schema.__mro__:
        spec = getattr(klass, "__dataclass_fields__", {}).get(name)
        if spec is not None and BOUNDS in spec.metadata:
            return spec.metadata[BOUNDS]
    return Bounds()


def _is_list_field(annotation: Any) -> bool:
    text = annotation if isinstance(annotation, str) else str(annotation)
    return text.startswith(("list[", "List["))


def _is_float_field(annotation: Any) -> bool:
    return "float" in (annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation)))


def _numbers(value: Any) -> list[Any]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [item for item in value if isinstance(item, int | float) and not isinstance(item, bool)]
    return []


def schema_problems(node: Any, schema: type, path: str) -> list[str]:
    """Every declared field of `schema` present in `node` against its declaration: float fields finite (unless
    their Bounds say nonfinite), numbers within their Bounds. The one place ranges are checked."""
    problems = []
    for spec in dataclasses.fields(schema):
        if spec.name not in node:
            continue
        bounds = declared_bounds(schema, spec.name)
        is_float = _is_float_field(spec.type)
        if bounds == Bounds() and not is_float and not _is_list_field(spec.type):
            continue
        key = f"{path}.{spec.name}" if path else spec.name
        try:
            value = node[spec.name]
        except Exception as error:  # an interpolation that cannot resolve, a missing mandatory value
            raw = node._get_node(spec.name)._value() if hasattr(node, "_get_node") else "?"
            problems.append(f"{key}={raw} cannot be read ({str(error).splitlines()[0]}): fix the value or the interpolation of {key}")
            continue
        if hasattr(value, "_content") and not isinstance(value, str):  # a ListConfig
            value = list(value)
        if _is_list_field(spec.type) and value is not None and not isinstance(value, list):  # an interpolation of a scalar
            problems.append(f"{key}={_show(value)} must be a list: pass {key}={_default(spec) or '[...]'}")
            continue
        numbers = _numbers(value)
        example = _example(bounds.example, node) if bounds.example is not None else _default(spec)
        fix = f"pass {key}={example}" if example is not None else f"pass a value {bounds.describe()}"
        if is_float and not bounds.nonfinite and any(isinstance(n, float) and not math.isfinite(n) for n in numbers):
            wanted = f"a finite number {bounds.describe()}".rstrip()
            problems.append(f"{key}={_show(value)} must be {wanted}: {fix}")
        elif is_float and not bounds.nonfinite and any(abs(n) > FLOAT32_MAX for n in numbers):
            problems.append(f"{key}={_show(value)} is beyond float32's range (about ±3.4e38), where it becomes inf: {fix}")
        elif any(not bounds.holds(n) for n in numbers if not (isinstance(n, float) and math.isnan(n))):
            each = "each entry " if isinstance(value, list) else ""
            problems.append(f"{key}={_show(value)} must be {each}{bounds.describe()}: {fix}")
    return problems


def _example(example: Any, node: Any) -> Any:
    """A declared example; a string with {field} takes that field of the node ("{dim}": the node's dim)."""
    if isinstance(example, str) and "{" in example:
        try:
            return example.format_map(node)
        except Exception:
            return None
    return example


def _default(spec: dataclasses.Field) -> Any:
    if spec.default is not dataclasses.MISSING:
        value = spec.default
    elif spec.default_factory is not dataclasses.MISSING:
        value = spec.default_factory()
    else:
        return None
    if isinstance(value, str) and value.startswith("${"):
        return None
    return _show(value)


def _show(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ",".join(str(item) for item in value) + "]"
    return str(value)
