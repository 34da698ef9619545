"""What the fault tests share: the run they interrupt, and a bitwise comparison of checkpoint weights."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

RUN = (
    "data.max_bytes=300000",
    "trainer.max_steps=8",
    "trainer.checkpoint_every=2",
    "trainer.keep_last=4",
    "logger=[jsonl]",
    "build.allow=[tests.faulty.DiskFiller,tests.faulty.ReadOnlyAfter,tests.faulty.Killer,tests.faulty.SlowLogger]",
)
"""8 TINY steps, checkpoints every 2 steps, evaluations every 3; build.allow lets the fault components in (by their exact names)."""


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """The model weights of a run's checkpoint, read as DCP stored them."""
    path = Path(run_dir) / "checkpoints" / f"step_{step}"
    metadata = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype) for key, meta in metadata.items() if key.startswith("train.model.")}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state


def same_weights(run_dir: Path, reference: Path, step: int = 8) -> bool:
    ours, theirs = weights(run_dir, step), weights(reference, step)
    return bool(ours) and ours.keys() == theirs.keys() and all(torch.equal(ours[key], theirs[key]) for key in ours)
