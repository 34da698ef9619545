"""Checkpoints in torch.distributed.checkpoint (DCP) format.

Layout: <run>/checkpoints/step_<N>/ holds DCP's shards and `.metadata`, then COMPLETE, written
last by rank 0 once every rank has finished, with each file's size and SHA-256 (the manifest). A folder
without COMPLETE is an interrupted save and is never resumed from; one whose files no longer match the
manifest is corrupted, and a resume falls back to the newest checkpoint that matches (Trainer.maybe_resume). DCP needs no process group: a single process saves and loads the same way,
and a different world size can load a checkpoint (DCP reshards on load).

A checkpoint is read as an untrusted file: DCP's own reader unpickles `.metadata` and its default planner reads
non-tensor items with torch.load(weights_only=False), so every load here goes through SafeReader (the metadata
against an exact allow-list, currytrain.safepickle) and SafeLoadPlanner (weights_only=True), and
metadata_problem checks the content before a load is tried.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import pickle
import shutil
import sys
import time
import warnings
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_model_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from currytrain.diskio import write_failure_cause
from currytrain.errors import ConfigError, RunFailed
from currytrain.safepickle import UnsafePickle, allow, safe_loads
from currytrain.weights import (
    MARKER,
    STEP_DIR,
    checkpoint_problem,
    checkpoint_step,
    complete_checkpoints,
    file_digests,
    is_complete,
    marker_count,
    saved_tokens,
)

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer


class TrainState(Stateful):
    """Everything a resumed run needs to continue bit-for-bit: weights, optimizer, schedule, step, the data
    offset, and the RNG state of every rank (each rank saves its own under rng.rank_<r>)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, rank: int = 0):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.rank = rank
        self.step = 0
        self.data_offset = 0
        """Added to the step to pick training batches: a rollback moves it past the data the failed steps saw."""
        self.tokens: int | None = 0
        self.schedule_start = 0
        """The step the LR schedule began at: 0, or where a trainer.resume_mode=weights resume restarted it (marker too)."""
        """Training tokens seen up to this step, exact when the batch size changed on a resume (kept in each
        checkpoint's marker, not in DCP's state: a checkpoint written before it existed still loads)."""
        self.with_rng = True
        """False while loading a checkpoint that has no RNG state for this rank (saved at a smaller world size)."""

    def state_dict(self) -> dict[str, Any]:
        if is_zero(self.optimizer):
            model_state, optim_state = get_model_state_dict(self.model), zero_optimizer_state(self.model, self.optimizer)
        else:
            model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optim_state, "scheduler": self.scheduler.state_dict(), "step": self.step, "data_offset": self.data_offset}
        if self.with_rng:
            state["rng"] = {f"rank_{self.rank}": torch.get_rng_state()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if is_zero(self.optimizer):
            set_model_state_dict(self.model, state["model"])
            load_zero_optimizer_state(self.optimizer, state["optimizer"])
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        self.data_offset = int(state["data_offset"])
        if "rng" in state:
            torch.set_rng_state(state["rng"][f"rank_{self.rank}"])


def is_zero(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` is a ZeroRedundancyOptimizer, without importing torch.distributed.optim (0.4 s of every
    run's start): only parallel.zero_stage=1 imports it, so when it is not loaded the optimizer cannot be one."""
    module = sys.modules.get("torch.distributed.optim")
    return module is not None and isinstance(optimizer, module.ZeroRedundancyOptimizer)


def zero_optimizer_state(model: torch.nn.Module, optimizer: ZeroRedundancyOptimizer) -> dict[str, Any]:
    """A ZeRO-1 rank's optimizer state in get_state_dict's layout ({"state": {fqn: ...}, "param_groups"}),
    holding only the parameters this rank owns; the ranks' states are disjoint, so together they are the
    whole state and any other layout (ddp, fsdp, single) loads the checkpoint."""
    _materialize_state(optimizer.optim)
    names = {param: name for name, param in model.named_parameters()}
    state = {names[param]: param_state for param, param_state in optimizer.optim.state.items()}
    groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": [names[p] for p in group["params"]]} for group in optimizer.param_groups]
    return {"state": state, "param_groups": groups}


def load_zero_optimizer_state(optimizer: ZeroRedundancyOptimizer, loaded: dict[str, Any]) -> None:
    """DCP loaded the owned parameters' state in place (into the tensors zero_optimizer_state handed out);
    only the groups' hyperparameters remain to set."""
    for group, saved in zip(optimizer.param_groups, loaded["param_groups"]):
        group.update({key: value for key, value in saved.items() if key != "params"})


def _materialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Create an optimizer's per-parameter state (a step at lr 0 on zero gradients changes no weight), so a
    fresh optimizer has tensors for DCP to load into."""
    if optimizer.state:
        return
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        for param in group["params"]:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
        for param in group["params"]:
            param.grad = None


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns that it assumes a single process when no group exists: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier() -> None:
    if _distributed():
        dist.barrier()


class Checkpointer:
    def __init__(self, folder: Path, keep_last: int, is_main: bool, model_node: dict[str, Any] | None = None, run_config: dict[str, Any] | None = None):
        self.folder = Path(folder)
        self.keep_last = keep_last
        self.is_main = is_main
        self.model_node = model_node
        """The model's config node, kept in each marker: a checkpoint copied out of its run folder still says
        which model it holds, so a resume into another architecture is refused before loading."""
        self.run_config = run_config
        """The whole resolved config, kept in each marker: a resume compares it with its own config and explains
        (or refuses) every difference."""

    def save(self, train_state: TrainState) -> Path:
        path = self.folder / f"step_{train_state.step}"
        if self.is_main and path.exists():
            shutil.rmtree(path)  # an interrupted save of the same step: start it afresh
        _barrier()
        started = time.perf_counter()
        try:
            with _quiet_single_process():
                dcp.save({"train": train_state}, checkpoint_id=str(path), no_dist=not _distributed())
            _barrier()  # every rank's shards are on disk before the marker says so
            if self.is_main:
                marker = {
                    "step": train_state.step,
                    "tokens": train_state.tokens,
                    "schedule_start": train_state.schedule_start,
                    "seconds": round(time.perf_counter() - started, 3),
                    "files": file_digests(path),
                    "model": self.model_node,
                    "config": self.run_config,
                }
                write_atomically(path / MARKER, json.dumps(marker) + "\n")
        except (Exception, CheckpointException) as error:
            raise self._failed_save(path, error) from error
        if self.is_main:
            self._prune(train_state.step)
        _barrier()
        return path

    def _failed_save(self, path: Path, error: BaseException) -> BaseException:
        """A save that could not write: remove its partial folder (it holds no marker, and removing it frees
        the space it took) and say why, when the storage is the cause; other errors pass through."""
        cause = write_failure_cause(error, self.folder)
        if cause is None:
            return error
        if self.is_main:
            shutil.rmtree(path, ignore_errors=True)
        intact = [p.name for p in complete_checkpoints(self.folder) if p != path]
        kept = f"the earlier checkpoints are intact ({', '.join(intact)})" if intact else "no earlier checkpoint exists"
        return RunFailed(
            f"could not write the checkpoint {path.name} into {self.folder}: {cause}; {kept}. "
            "Free space (or make the folder writable), then continue with trainer.resume=auto"
        )

    def _prune(self, saved_step: int) -> None:
        """Keep the newest keep_last complete checkpoints, and drop interrupted saves older than the one
        just written (they can never be resumed from)."""
        for old in complete_checkpoints(self.folder)[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        for path in self.folder.iterdir():
            match = STEP_DIR.match(path.name)
            if match and int(match.group(1)) < saved_step and not is_complete(path):
                shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def load(path: Path, train_state: TrainState) -> None:
        """Load a checkpoint that checkpoint_problem found intact (the caller checks: it picks another if not).
        A checkpoint whose state does not fit this run (another optimizer, a layout DCP cannot reshard) is a
        ConfigError naming the mismatch and the fix."""
        if not is_complete(path):
            raise ConfigError(f"trainer.resume: {path} is not a complete checkpoint (no {MARKER} marker)")
        try:
            saved = read_metadata(path).state_dict_metadata
            train_state.with_rng = f"train.rng.rank_{train_state.rank}" in saved
            dcp_load({"train": train_state}, path)
        except UnsafePickle as error:
            raise ConfigError(f"trainer.resume: {path} {error}: restore the checkpoint from a copy you trust, or resume an earlier one") from None
        except (CheckpointException, RuntimeError, KeyError, ValueError) as error:
            if isinstance(cause := _unsafe_cause(error), UnsafePickle):
                raise ConfigError(f"trainer.resume: {path} {cause}: restore the checkpoint from a copy you trust, or resume an earlier one") from None
            raise ConfigError(
                f"trainer.resume: {path} holds a training state this run cannot load ({_first_line(error)}): resume with the "
                "settings it was saved with (the journal's header and config_diff show them), or pass trainer.resume_mode=weights "
                "to load the model weights alone and start the optimizer afresh"
            ) from error
        finally:
            train_state.with_rng = True
        train_state.tokens = saved_tokens(path)  # None: a checkpoint from before the count (the trainer estimates it)
        train_state.schedule_start = marker_count(path, "schedule_start") or 0

    @staticmethod
    def load_weights(path: Path, train_state: TrainState) -> None:
        """Load only the model weights of an intact checkpoint (trainer.resume_mode=weights), resharded to this
        run's layout; the optimizer, schedule and RNG stay as built."""
        model_state = get_model_state_dict(train_state.model)
        dcp_load({"train": {"model": model_state}}, path)
        set_model_state_dict(train_state.model, model_state)
        train_state.step = checkpoint_step(path) or 0
        train_state.tokens = saved_tokens(path)  # None: a checkpoint from before the count (the trainer estimates it)


def _unsafe_cause(error: BaseException) -> BaseException | None:
    """The UnsafePickle inside a CheckpointException (DCP gathers each rank's failure into one), if any."""
    failures = getattr(error, "failures", None) or {}
    for failure in failures.values():
        if isinstance(failure, UnsafePickle) or isinstance(getattr(failure, "__cause__", None), UnsafePickle):
            return failure if isinstance(failure, UnsafePickle) else failure.__cause__
    return error.__cause__ if isinstance(error.__cause__, UnsafePickle) else None


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    missing = next((line for line in lines if "Missing key" in line or "Unexpected key" in line), None)
    return (missing or (lines[0] if lines else type(error).__name__))[:300]


def load_model_state(path: Path, model_state: dict[str, Any]) -> None:
    """Fill `model_state` (a model's state_dict) in place from a checkpoint's weights, leaving out the
    optimizer, schedule and RNG: for exports and for starting other runs from these weights."""
    if problem := checkpoint_problem(path) or metadata_problem(path):
        raise ConfigError(f"{path} {problem}: pass an earlier checkpoint (`currytrain verify RUN` lists the intact ones)")
    dcp_load({"train": {"model": model_state}}, path)


def write_atomically(path: Path, text: str) -> None:
    """Write a small file whole or not at all (a temporary file renamed over it)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def _layout(name: str) -> torch.layout:
    """torch.serialization._get_layout's answer for a layout's name, and only for a layout's name."""
    layouts = {str(value): value for value in vars(torch).values() if isinstance(value, torch.layout)}
    if name not in layouts:
        raise UnsafePickle(f"{name!r} is not a torch layout")
    return layouts[name]


def _metadata_allowed() -> dict[tuple[str, str], Any]:
    """The exact globals DCP's .metadata holds: its own records, torch sizes, dtypes and layouts (by name), paths."""
    from torch.distributed.checkpoint import filesystem, metadata

    records = (
        metadata.Metadata,
        metadata.MetadataIndex,
        metadata.StorageMeta,
        metadata.TensorStorageMetadata,
        metadata.BytesStorageMetadata,
        metadata.ChunkStorageMetadata,
        metadata.TensorProperties,
        metadata._MEM_FORMAT_ENCODING,
        filesystem._StorageInfo,
    )
    table = allow(*records, collections.OrderedDict, stand_ins={("torch.serialization", "_get_layout"): _layout})
    table[("torch", "Size")] = torch.Size  # its __module__ is torch's C extension, the pickle names it torch.Size
    table.update({("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)})
    for module in ("pathlib", "pathlib._local"):  # where Python <3.13 and >=3.13 keep the path classes
        table[(module, "PosixPath")] = PurePosixPath
        table[(module, "WindowsPath")] = PureWindowsPath
        table[(module, "PurePosixPath")] = PurePosixPath
        table[(module, "PureWindowsPath")] = PureWindowsPath
    return table


METADATA_MAX_BYTES = 1 << 30
"""A .metadata larger than this (1 GiB) is refused unread: DCP's own for a 1T-parameter model is far smaller."""


def read_metadata(path: Path) -> Any:
    """A checkpoint's DCP Metadata, read without pickle's open door: the opcodes are checked against the exact
    globals such metadata holds (_metadata_allowed) before anything is unpickled, and only those are built.
    Raises UnsafePickle naming what is refused (os.system, a dotted name, an extension code, ...)."""
    file = Path(path) / ".metadata"
    if file.stat().st_size > METADATA_MAX_BYTES:
        raise UnsafePickle(f".metadata has {file.stat().st_size:,} bytes, more than checkpoint metadata ever holds")
    return safe_loads(file.read_bytes(), _metadata_allowed(), what=".metadata")


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader with its one plain pickle.load (the .metadata) replaced by read_metadata."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        rank = kwargs.get("rank")
        metadata = read_metadata(Path(self.path)) if rank is None else _rank_metadata(Path(self.path), rank)
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _rank_metadata(path: Path, rank: int) -> Any:
    return safe_loads((path / f"__{int(rank)}.metadata").read_bytes(), _metadata_allowed(), what=f"__{int(rank)}.metadata")


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading the non-tensor items of a checkpoint (the step, the data offset, the
    schedule's and optimizer groups' plain values) with torch.load(weights_only=True) instead of a full unpickle."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as error:
            raise UnsafePickle(f"the checkpoint item {read_item.dest_index.fqn} is not plain data ({_first_line(error)})") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def dcp_load(state: dict[str, Any], path: Path) -> None:
    """dcp.load through SafeReader and SafeLoadPlanner: nothing in the folder is unpickled beyond plain data."""
    with _quiet_single_process():
        dcp.load(state, storage_reader=SafeReader(str(path)), planner=SafeLoadPlanner(), no_dist=not _distributed())


def metadata_problem(path: Path) -> str | None:
    """Why the checkpoint at `path` must not be loaded, judged from its content (the checksums are
    weights.checkpoint_problem's): a .metadata that names something checkpoint metadata never holds (a file crafted
    to run code) or cannot be read, a shard shorter than the items the metadata places in it, a non-tensor item
    that is not plain data. None when all of it reads. Nothing it reads is ever run."""
    path = Path(path)
    try:
        metadata = read_metadata(path)
    except UnsafePickle as error:
        return f".metadata is unsafe to load ({error})"
    except Exception as error:  # truncated or garbled: the checksums usually say so first
        return f".metadata cannot be read ({type(error).__name__}: {error})"
    try:
        return _items_problem(path, metadata)
    except (AttributeError, TypeError, ValueError, KeyError) as error:  # metadata of allowed classes, nonsensical fields
        return f".metadata does not describe its shards ({type(error).__name__}: {error})"


def _items_problem(path: Path, metadata: Any) -> str | None:
    """Every item the metadata places must lie inside its file (a shard cut short is found even when the marker
    lists no checksums), and every non-tensor item must read as plain data (torch.load, weights_only)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    sizes: dict[str, int] = {}
    for index, info in (metadata.storage_data or {}).items():
        name = str(info.relative_path)
        file = path / name
        if Path(name).name != name or not file.is_file():
            return f"is missing {name}, which its .metadata lists"
        size = sizes.setdefault(name, file.stat().st_size)
        if int(info.offset) < 0 or int(info.length) < 0 or int(info.offset) + int(info.length) > size:
            return f"{name} has {size} bytes, fewer than its .metadata places in it (truncated)"
        if isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata) and not info.transform_descriptors:
            with file.open("rb") as handle:
                handle.seek(int(info.offset))
                item = handle.read(int(info.length))
            try:
                torch.load(io.BytesIO(item), weights_only=True)
            except Exception as error:
                return f"its item {index.fqn} is not plain data ({_first_line(error)})"
    return None
