"""Pickles read from files curryTrain does not trust (a checkpoint's DCP `.metadata`, an Optuna study's sampler
state): an allow-list of exact (module, name) pairs, checked twice.

First every opcode of the pickle is walked (pickletools, which runs nothing): each global it names must be one
of the allowed pairs, spelled without dots (protocol 4 resolves `module.a.b` through attributes, which is how an
allowed module that imports `os` would hand out `os.system`), and the opcodes that reach objects by other routes
(the copyreg extension registry, persistent ids) are refused. Only a pickle that passes is unpickled, by an
unpickler whose find_class returns the allowed objects from the table it was given and nothing else.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from collections.abc import Callable, Mapping
from typing import Any

Allowed = Mapping[tuple[str, str], Any]
"""(module, name) -> the object find_class returns for it (usually the object itself, or a narrower stand-in)."""

STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
MEMO_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}
MEMO_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}
REFUSED_OPS = {"EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"}
"""Opcodes that fetch objects without naming them (copyreg's extension codes, persistent ids): never allowed."""


class UnsafePickle(pickle.UnpicklingError):
    """A pickle that names something outside its allow-list, or that cannot be read safely."""


def pickle_globals(data: bytes) -> list[tuple[str, str]]:
    """Every (module, name) the pickle `data` would import, in order, found without unpickling anything.

    GLOBAL and INST carry their names inline; STACK_GLOBAL takes the two strings pushed just before it (directly
    or from the memo). A STACK_GLOBAL whose names are not such strings is refused: what it imports cannot be
    known without running the pickle. Raises UnsafePickle, or ValueError for bytes that are not a pickle."""
    found: list[tuple[str, str]] = []
    memo: dict[int, Any] = {}
    pushed: list[Any] = []  # the values pushed since the last opcode that consumed the stack (None: not a string)
    for opcode, arg, _ in pickletools.genops(data):
        name = opcode.name
        if name in REFUSED_OPS:
            raise UnsafePickle(f"it uses the {name} opcode, which fetches objects without naming them")
        if name in ("GLOBAL", "INST"):
            module, _, attribute = str(arg).partition(" ")
            found.append((module, attribute))
            pushed = [None]
        elif name == "STACK_GLOBAL":
            if len(pushed) < 2 or not all(isinstance(value, str) for value in pushed[-2:]):
                raise UnsafePickle("a STACK_GLOBAL whose module and name are not plain strings pushed just before it")
            found.append((pushed[-2], pushed[-1]))
            pushed = [None]
        elif name in STRING_OPS:
            pushed.append(arg.decode("latin-1") if isinstance(arg, bytes) else arg)
        elif name in MEMO_GET_OPS:
            pushed.append(memo.get(arg))
        elif name in MEMO_PUT_OPS:
            memo[arg] = pushed[-1] if pushed else None
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name not in ("FRAME", "PROTO"):
            pushed = [None]
    return found


def refused_globals(data: bytes, allowed: Allowed) -> list[str]:
    """The globals of `data` that are not allowed (a dotted name never is), as `module.name` strings."""
    return [f"{module}.{name}" for module, name in pickle_globals(data) if "." in name or (module, name) not in allowed]


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, allowed: Allowed):
        super().__init__(file)
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if "." in name or (module, name) not in self.allowed:
            raise UnsafePickle(f"{module}.{name} is not allowed here")
        return self.allowed[(module, name)]

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickle("persistent ids are not allowed here")


def safe_loads(data: bytes, allowed: Allowed, what: str = "the pickle") -> Any:
    """Unpickle `data` when every global it names is in `allowed` (checked on the opcodes first); else raise
    UnsafePickle naming what is refused. Bytes that are not a whole pickle raise UnsafePickle too."""
    try:
        refused = refused_globals(data, allowed)
    except UnsafePickle as error:
        raise UnsafePickle(f"{what} is refused: {error}") from None
    except Exception as error:  # pickletools' own complaints about garbled bytes
        raise UnsafePickle(f"{what} is not a readable pickle ({type(error).__name__}: {error})") from None
    if refused:
        raise UnsafePickle(f"{what} names {', '.join(sorted(set(refused)))}, which it may not hold")
    try:
        return _Unpickler(io.BytesIO(data), allowed).load()
    except UnsafePickle:
        raise
    except Exception as error:  # well-formed opcodes that still do not build (wrong arguments to an allowed class)
        raise UnsafePickle(f"{what} cannot be unpickled ({type(error).__name__}: {error})") from None


def allow(*objects: Any, stand_ins: Mapping[tuple[str, str], Callable[..., Any]] | None = None) -> dict[tuple[str, str], Any]:
    """The allow-list of the given classes and functions, each under its own (module, qualname), plus stand-ins:
    pairs a pickle names whose real object would be too wide, answered by a narrower function."""
    table = {(obj.__module__, obj.__qualname__): obj for obj in objects}
    table.update(stand_ins or {})
    return table
