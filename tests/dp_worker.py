"""What the workers of tests/test_parallel.py run: several training runs, one after another, inside one
process group (spawned once: starting workers costs more than the tiny runs)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from currytrain.components import parallel_session
from currytrain.trainer.trainer import Trainer
from currytrain.workers import worker_threads


def train_each(resolved_paths: list[str]) -> None:
    """Train every resolved config in order; each run's journal (rank 0) holds its curve."""
    torch.set_num_threads(worker_threads())  # as run_worker does: 2 workers share the cores
    dist.init_process_group("gloo")  # shared by the runs: each session finds it open and leaves it open
    try:
        for path in resolved_paths:
            cfg = OmegaConf.load(path)
            with parallel_session(cfg) as state:
                Trainer(cfg, Path(path).parent, state).train()
    finally:
        dist.destroy_process_group()
