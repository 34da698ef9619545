"""Hydra's composition errors in curryTrain's words: the full key, what is wrong with it, and the override or edit
that fixes it. Hydra answers a mistyped key with "To append to your config use +trainer.batchsize=4" (the wrong
fix: the key would then be ignored) and a list where a value was given with "str is not a ListConfig";
composition_problem() turns each error it knows into one line, and unknown_key_problem() is the one wording of
"this key is not a field" that validation (a `+key=value`) and composition (a key in a YAML file) share.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any

from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ConfigTypeError, ValidationError

PROJECT_PACKAGE = "experiments."
"""The package of a project's own ideas: a field missing from one of their schemas is added there, in the project."""
MAX_LISTED = 12
"""A schema with more fields than this is not listed in the message (model=gqa has dozens)."""


def composition_problem(error: BaseException) -> str | None:
    """The problem behind an error Hydra raised while composing, with its fix; None for one this does not know
    (Hydra's own message stands then)."""
    if isinstance(error, MissingConfigException) and error.options and (found := re.search(r"Could not find '(.+)/([^/']+)'", str(error))):
        group, name = found.groups()
        return f"{group}={name}: {group} has no option '{name}': choose from {sorted(error.options)}"
    if not isinstance(error, ConfigCompositionException):
        return None
    cause, text = error.__cause__ or error.__context__, str(error)  # a YAML file's key: Hydra raises while handling it
    key = getattr(cause, "full_key", None)
    if not key:
        return None
    schema = getattr(cause, "object_type", None)
    overridden = re.search(r"(?:use \+|override )\+*(?:~?)([^=\s]+)=(.*)$", text, flags=re.S)
    value = overridden.group(2).strip() if overridden else None
    if isinstance(cause, ConfigKeyError | ConfigAttributeError) and dataclasses.is_dataclass(schema):
        source = re.match(r"In '([^']+)'", text)
        return unknown_key_problem(key, schema, value=value, source=f"conf/{source.group(1)}.yaml" if source else None)
    if isinstance(cause, ValidationError | ConfigTypeError):
        return _wrong_value(key, value, schema, str(cause).splitlines()[0])
    return None


def unknown_key_problem(key: str, schema: type, *, value: Any = None, source: str | None = None, added: bool = False) -> str:
    """`key` is not a field of `schema`: the nearest field it may mean, else (a project's schema) the field to add.

    value: what an override set (its fix then keeps the value); source: the YAML file that set the key; added: a
    `+key=value` override put it in (validation's case: the run would ignore it)."""
    parent, _, name = key.rpartition(".")
    prefix = f"{parent}." if parent else ""
    fields = [field.name for field in dataclasses.fields(schema) if not field.name.startswith("_")]
    near = difflib.get_close_matches(name, fields, n=1)
    where = f"{key}{f' (in {source})' if source else ''} is not a field of {schema.__name__}{', so it would be ignored' if added else ''}"
    if near:
        fix = f"pass {prefix}{near[0]}={value}" if value is not None and source is None else f"rename it to {near[0]}"
        return f"{where}: did you mean {prefix}{near[0]}? {fix}"
    listed = f"fields: {fields}" if len(fields) <= MAX_LISTED else f"`python launch.py --cfg job` shows {parent or 'the root'}'s fields"
    if schema.__module__.startswith(PROJECT_PACKAGE):
        config_py = schema.__module__.replace(".", "/") + ".py"
        return (
            f"{where}, the schema of your idea: add a field `{name}` (its type, default and a docstring) to {schema.__name__} in {config_py} "
            f"and the argument of the same name to the class it builds; or remove the key ({listed})"
        )
    return f"{where}: remove it ({listed})"


def _wrong_value(key: str, value: str | None, schema: Any, reason: str) -> str:
    """A value of the wrong kind for its field: what the field takes and an override of that kind."""
    shown = f"{key}={value}" if value is not None else key
    default = _default(schema, key.rpartition(".")[2])
    example = f" (its default: {key}={default})" if default is not None else ""
    if "is not a ListConfig" in reason:
        return f"{shown} must be a list: pass {key}=[{value if value is not None else '...'}]"
    if "could not be converted to Integer" in reason:
        return f"{shown} must be a whole number: pass {key}=<int>{example}"
    if "could not be converted to Float" in reason:
        return f"{shown} must be a number: pass {key}=<float>{example}"
    if "is not a valid bool" in reason:
        return f"{shown} must be true or false: pass {key}=true (or false)"
    if "does not support deletion" in reason:
        return f"~{key}: every field of {getattr(schema, '__name__', 'its schema')} keeps a value, so {key} cannot be deleted: set it instead ({key}=<value>)"
    if "is not a subclass of" in reason:
        return f"{shown}: {key} is a group of typed fields, not one value: set a field of it, e.g. {key}.<field>=<value> ({reason})"
    return f"{shown}: {reason}: pass a value of the field's type{example}"


def _default(schema: Any, name: str) -> Any:
    """The declared default of field `name` of `schema`, or None."""
    if not dataclasses.is_dataclass(schema):
        return None
    field = next((f for f in dataclasses.fields(schema) if f.name == name), None)
    if field is None or field.default is dataclasses.MISSING:
        return None
    return str(field.default).lower() if isinstance(field.default, bool) else field.default
