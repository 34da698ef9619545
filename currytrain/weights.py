"""Folders of weights, read without torch (validation uses them before anything runs): which checkpoint
to resume from, and which model a folder holds.

A weights folder is an import folder (`currytrain hf import`: model.yaml + model.safetensors), a run
folder (resolved.yaml + checkpoints/) or one checkpoint folder (<run>/checkpoints/step_N).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from currytrain.model.config import APPLIED_FROM_OUTSIDE

MODEL_YAML = "model.yaml"
RESOLVED = "resolved.yaml"
MARKER = "COMPLETE"
"""Written last into a checkpoint folder, once every rank's shards are on disk. It holds the folder's
manifest: each file's size and SHA-256, so a load can tell a shard cut short or changed on disk."""
STEP_DIR = re.compile(r"^step_(\d+)$")


YAML_MAX_BYTES = 16 << 20
"""The largest resolved.yaml or model.yaml a reader parses (16 MiB: a resolved config is a few KiB)."""


class _NoAliases(yaml.SafeLoader):
    """YAML without anchors' aliases: each alias copies its anchor again when a config is built from the data, so a
    few hundred bytes of nested aliases expand to billions of nodes."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.YAMLError(f"an alias (*{event.anchor}) at line {event.start_mark.line + 1}, which curryTrain never writes")
        return super().compose_node(parent, index)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """A YAML file of a run or import folder (resolved.yaml, model.yaml) as plain data, read with bounded work: at
    most YAML_MAX_BYTES, no aliases, no interpolations (curryTrain writes these files resolved, so a `${...}` is an
    edit, and nested ones expand without bound). Raises ConfigError naming the file and what is wrong with it."""
    from currytrain.errors import ConfigError

    path = Path(path)
    fix = "restore it from the run that wrote it, or pass another folder"
    try:
        if path.stat().st_size > YAML_MAX_BYTES:
            raise ConfigError(f"{path} has {path.stat().st_size:,} bytes, more than a config curryTrain writes ({YAML_MAX_BYTES:,}): {fix}")
        data = yaml.load(path.read_text(), Loader=_NoAliases)  # noqa: S506 (a SafeLoader subclass)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError, ValueError) as error:
        reason = " ".join(str(error).split())[:300] or type(error).__name__
        raise ConfigError(f"{path} cannot be read as a curryTrain config ({reason}): {fix}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}, not a mapping of config keys: {fix}")
    if (where := _interpolation(data)) is not None:
        raise ConfigError(f"{path} holds an interpolation at {where}, which curryTrain writes resolved: {fix}")
    return data


def _interpolation(tree: Any, path: str = "") -> str | None:
    """The key of the first value or key holding `${`, or None."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            where = f"{path}.{key}" if path else str(key)
            if "${" in str(key) or (found := _interpolation(value, where)) is not None:
                return where if "${" in str(key) else found
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            if (found := _interpolation(value, f"{path}[{index}]")) is not None:
                return found
    elif isinstance(tree, str) and "${" in tree:
        return path or "the top"
    return None


def read_marker(path: Path) -> dict[str, Any] | None:
    """A checkpoint folder's COMPLETE marker as a mapping, or None when it is missing or is not a JSON mapping."""
    try:
        marker = json.loads((Path(path) / MARKER).read_text())
    except (ValueError, OSError):
        return None
    return marker if isinstance(marker, dict) else None


def is_complete(path: Path) -> bool:
    return (Path(path) / MARKER).is_file()


def file_digests(folder: Path) -> dict[str, dict[str, Any]]:
    """{name: {"bytes", "sha256"}} of every file in a checkpoint folder but its marker."""
    digests = {}
    for path in sorted(Path(folder).iterdir()):
        if path.is_file() and path.name != MARKER:
            with path.open("rb") as handle:
                digests[path.name] = {"bytes": path.stat().st_size, "sha256": hashlib.file_digest(handle, "sha256").hexdigest()}
    return digests


def checkpoint_problem(path: Path) -> str | None:
    """Why the checkpoint folder `path` must not be loaded (an interrupted save, a file missing, cut short or
    changed since the save), or None when every file matches the manifest. A marker without a manifest
    (written before checksums existed) is trusted."""
    path = Path(path)
    if not is_complete(path):
        return f"has no {MARKER} marker (an interrupted save)"
    marker = read_marker(path)
    if marker is None:
        return f"its {MARKER} marker is unreadable (changed since the save)"
    manifest = marker.get("files")
    if manifest is None:
        return None
    if not isinstance(manifest, dict) or not all(isinstance(e, dict) and {"bytes", "sha256"} <= set(e) for e in manifest.values()):
        return f"its {MARKER} marker's manifest is not a mapping of file -> bytes and sha256 (changed since the save)"
    for name, expected in manifest.items():
        file = path / name
        if Path(name).name != name or not file.is_file():
            return f"is missing {name}"
        size = file.stat().st_size
        if size != expected["bytes"]:
            return f"{name} has {size} bytes, the save wrote {expected['bytes']} (truncated or overwritten)"
        with file.open("rb") as handle:
            if hashlib.file_digest(handle, "sha256").hexdigest() != expected["sha256"]:
                return f"{name} differs from its checksum (its bytes changed since the save)"
    return None


def complete_checkpoints(folder: Path) -> list[Path]:
    """Complete step_N folders of a checkpoints folder, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := STEP_DIR.match(p.name)) and is_complete(p)]
    return [path for _, path in sorted(found)]


def find_checkpoint(location: Path) -> Path | None:
    """The checkpoint to resume from: a checkpoint folder itself, or the latest complete one of a run folder."""
    found = checkpoint_candidates(location)
    return found[0] if found else None


def checkpoint_step(path: Path) -> int | None:
    """The step a complete checkpoint folder was saved at (from its marker, else its name)."""
    step = (read_marker(path) or {}).get("step")
    if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
        return step
    match = STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def checkpoint_candidates(location: Path) -> list[Path]:
    """What a resume from `location` may load, newest first: the checkpoint folder itself, or the complete
    checkpoints of a run folder (an older one stands in when a newer one fails its checksums)."""
    location = Path(location)
    if is_complete(location):
        return [location]
    for folder in (location / "checkpoints", location):
        found = complete_checkpoints(folder)
        if found:
            return found[::-1]
    return []


def resume_checkpoint(resume: str, run_dir: str | Path | None) -> Path | None:
    """The checkpoint trainer.resume names (none, auto = this run folder, or a path), or None when there is none."""
    if resume == "none" or (resume == "auto" and run_dir is None):
        return None
    return find_checkpoint(Path(run_dir if resume == "auto" else resume).expanduser())


def model_node_of(path: str | Path) -> dict[str, Any] | None:
    """The model config node the weights at `path` were written with, or None if `path` is none of the three.
    A node that is not a mapping with a _target_ (an edited marker or file) is a ConfigError naming where it is."""
    from currytrain.errors import ConfigError

    path = Path(path).expanduser()
    if is_complete(path):  # a checkpoint folder names its model in its marker, even copied out of its run
        node = (read_marker(path) or {}).get("model")
        if node:
            return _model_node(node, f"{path / MARKER}'s model")
    for candidate, key in ((path / MODEL_YAML, None), (path / RESOLVED, "model"), (path.parent.parent / RESOLVED, "model")):
        if candidate.is_file():
            data = read_yaml_mapping(candidate)
            if key is not None and key not in data:
                raise ConfigError(f"{candidate} has no {key} node: restore it from the run that wrote it, or pass another folder")
            return _model_node(data[key] if key else data, f"{candidate}'s {key}" if key else str(candidate))
    return None


def _model_node(node: Any, where: str) -> dict[str, Any]:
    from currytrain.errors import ConfigError

    if not isinstance(node, dict) or not isinstance(node.get("_target_"), str):
        raise ConfigError(f"{where} is not a model config node (a mapping with a _target_): restore it, or pass another folder")
    return node


NOT_IN_WEIGHTS = ("max_seq_len", "init_std")
"""Model fields that neither shape a weight nor change what a weight computes: max_seq_len only sizes the RoPE
tables (positions keep their angles whatever the table length), init_std only draws the weights that loading
replaces. A config may differ from the weights' node in these (fine-tune an 8k-context import at 512)."""


def architecture_mismatch(node: Mapping[str, Any], model_cfg: Mapping[str, Any]) -> str | None:
    """Why model_cfg cannot load weights written with `node` (the overrides that fix it), or None if it can."""
    if node.get("_target_") != model_cfg.get("_target_"):
        return f"holds a {node.get('_target_')}, the config builds {model_cfg.get('_target_')}: choose the matching model="
    fields = {key: value for key, value in node.items() if key not in APPLIED_FROM_OUTSIDE + NOT_IN_WEIGHTS and key in model_cfg}
    mismatched = {key: value for key, value in fields.items() if model_cfg[key] != value}
    if not mismatched:
        return None
    return "holds a model the config does not describe: pass " + " ".join(f"model.{k}={v}" for k, v in mismatched.items())


SAFETENSORS_HEADER_MAX = 100_000_000
"""The largest header (bytes) a safetensors file may declare (the format's own limit)."""


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a complete safetensors file (empty, random bytes, broken header, truncated), or None.

    Reads only the header: an 8-byte little-endian length, that many bytes of JSON, then the tensor data,
    whose extent the header's data_offsets must cover exactly."""
    size = path.stat().st_size
    if size < 8:
        return f"{path} is not a safetensors file: {'it is empty' if size == 0 else f'it has {size} bytes'}; download or write it again"
    with path.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if length > min(size - 8, SAFETENSORS_HEADER_MAX):
            return f"{path} is not a safetensors file: its header length {length} exceeds the file ({size} bytes); download or write it again"
        try:
            header = json.loads(handle.read(length))
            ends = [int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return f"{path} is not a safetensors file: its header is not valid safetensors JSON; download or write it again"
    data = size - 8 - length
    if max(ends, default=0) != data:
        return (
            f"{path} is truncated or corrupted: its header describes {max(ends, default=0)} bytes of tensors, the file holds {data}; download or write it again"
        )
    return None


# ------------------------------------------------------------------------------------- resume with changes

RESUME_MODES = ("full", "weights")
"""trainer.resume_mode: full (weights, optimizer, schedule, RNG and data position, bit for bit) or weights (the
model weights only; a fresh optimizer and schedule, the step and tokens seen continue)."""
RESUME_KEYS = ("trainer.resume", "trainer.resume_mode")
"""How to resume is not part of what is resumed."""
OPTIMIZER_STATE = {"build_adamw": "exp_avg, exp_avg_sq", "build_sgd": "momentum_buffer"}
"""The per-parameter state each built-in optimizer keeps, for the message that refuses to carry it over."""


def marker_config(checkpoint: str | Path) -> dict[str, Any] | None:
    """The resolved run config kept in a checkpoint's marker, or None for a checkpoint saved before it was kept.
    A config that is not a mapping (an edited marker) is a ConfigError."""
    config = marker_field(checkpoint, "config") or None
    if config is not None and not isinstance(config, dict):
        from currytrain.errors import ConfigError

        raise ConfigError(f"{Path(checkpoint) / MARKER}'s config is not a mapping of config keys: restore the checkpoint from a copy, or pass another one")
    return config


def saved_config_of(checkpoint: str | Path) -> dict[str, Any] | None:
    """The resolved run config a checkpoint was saved with: its marker's, else its run folder's resolved.yaml
    (right until a relaunch rewrites it: validation reads it before that), else None."""
    if (config := marker_config(checkpoint)) is not None:
        return config
    resolved = Path(checkpoint).parent.parent / RESOLVED
    return read_yaml_mapping(resolved) if resolved.is_file() else None


def marker_field(checkpoint: str | Path, key: str) -> Any:
    """One field of a checkpoint's marker, or None (absent, or an unreadable marker)."""
    return (read_marker(Path(checkpoint)) or {}).get(key)


def marker_count(checkpoint: str | Path, key: str) -> int | None:
    """A whole-number field of a checkpoint's marker (tokens, schedule_start), or None when absent or not a count."""
    value = marker_field(checkpoint, key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def saved_tokens(checkpoint: str | Path) -> int | None:
    """Training tokens seen up to a checkpoint (its marker's count), or None for a checkpoint that predates it."""
    return marker_count(checkpoint, "tokens")


def config_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{key: {"checkpoint": value, "now": value}} for every key whose value differs (RESUME_KEYS aside)."""
    ours, theirs = _flatten(now), _flatten(saved)
    keys = sorted((set(ours) | set(theirs)) - set(RESUME_KEYS))
    return {key: {"checkpoint": theirs.get(key), "now": ours.get(key)} for key in keys if ours.get(key) != theirs.get(key)}


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, Mapping):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _short(target: Any) -> str:
    return str(target).rpartition(".")[2]


def optimizer_state_problems(saved: Mapping[str, Any], now: Mapping[str, Any], resume: str) -> list[str]:
    """Why the checkpoint's optimizer state cannot continue in the configured optimizer (another optimizer,
    or one whose state holds other keys), each with the fix; empty when it can."""
    before, after = saved.get("optimizer") or {}, now.get("optimizer") or {}
    weights = "or trainer.resume_mode=weights to keep the model weights and start the optimizer and its schedule afresh"
    if before.get("_target_") != after.get("_target_"):
        old = _short(before.get("_target_"))
        state = f" (its state: {OPTIMIZER_STATE[old]})" if old in OPTIMIZER_STATE else ""
        option = old.removeprefix("build_")
        return [
            f"trainer.resume={resume}: the checkpoint holds the state of optimizer._target_={before.get('_target_')}{state}, and the config builds "
            f"{after.get('_target_')}, which cannot continue it: pass optimizer={option} to continue as saved, {weights}"
        ]
    if "momentum" in before and "momentum" in after and (before["momentum"] == 0) != (after["momentum"] == 0):
        return [
            f"trainer.resume={resume}: optimizer.momentum={after['momentum']} where the checkpoint has {before['momentum']}: SGD keeps a "
            f"momentum_buffer only when momentum is not 0, so the saved state has other keys: pass optimizer.momentum={before['momentum']}, {weights}"
        ]
    return []
