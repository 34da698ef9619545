"""Typed config of the training loop (the root `trainer:` node; not a group)."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any

from currytrain.rules import at_least, one_of


def compiler_missing() -> bool:
    """True when inductor would find no C++ compiler ($CXX, else g++; clang++ on macOS). Torch-free."""
    return shutil.which(os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")) is None


DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16")
COMPILE_CHOICES = (True, False, "auto")


@dataclass
class TrainerConfig:
    max_steps: int = 1200
    """Optimizer steps to run."""
    batch_size: int = 8
    """Sequences per microbatch, all data-parallel ranks together (each rank gets batch_size / dp ranks)."""
    grad_accum: int = 1
    """Microbatches per optimizer step; the loss of each is scaled by 1/grad_accum."""
    grad_clip: float = 1.0
    """Max global gradient L2 norm; 0 disables clipping."""
    eval_every: int = 400
    """Evaluate on the val split every this many steps (and always at the end)."""
    eval_batches: int = 40
    """Val batches per evaluation (40 of the default 8 sequences: 320 windows, a val loss steady to about 0.02)."""
    log_every: int = 10
    """Send train metrics to the loggers every this many steps."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps; 0 saves only at the end."""
    checkpoint_on_signal: bool = True
    """On Ctrl-C, SIGTERM, SIGUSR1 or SIGUSR2 (SLURM's warnings), finish the step, save a checkpoint, then stop
    (exit 128 + the signal's number); trainer.resume=auto continues from it. False stops without saving."""
    keep_last: int = 2
    """Complete checkpoints kept in <run>/checkpoints; older ones are deleted."""
    resume: str = "none"
    """none, auto (latest complete checkpoint of this run folder), or a path to a run folder or checkpoint."""
    init_from: str = "none"
    """none, or model weights to start from (an `currytrain hf import` folder, a run folder or a checkpoint):
    weights only, fresh optimizer and step 0. Ignored when trainer.resume finds a checkpoint."""
    device: str = "auto"
    """auto (cuda when present, else cpu), cpu or cuda."""
    precision: str = "fp32"
    """fp32, bf16 (autocast; the weights and optimizer stay fp32) or fp16 (autocast + loss scaling; CUDA only)."""
    progress: bool = True
    """Show the rich progress bar (step, loss, tokens/s, ETA)."""
    compile: Any = False
    """true, false or auto. true: torch.compile the model and the loss (inductor; on CPU it needs a C++ compiler): as
    one graph in one process, block by block under parallelism (docs/performance.md). The first step pays the
    compilation (the journal's `compile` event says how long); the compiled code is cached in
    <run folder>/../.compile_cache, so a later run of the same shapes starts fast. auto (one process): times two
    eager steps, then compiles only when the eager time it expects to save over the remaining steps exceeds the
    compile cost (measured by an earlier compiled run of the same setup in that cache folder, else assumed); the
    journal's `compile_choice` event says which it chose and why."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = at_least(node, path, ("max_steps", "batch_size", "grad_accum", "eval_every", "eval_batches", "log_every", "keep_last"))
        if not node.grad_clip >= 0:
            problems.append(f"{path}.grad_clip={node.grad_clip} must be >= 0 (0 disables clipping): pass {path}.grad_clip=1.0")
        if not node.checkpoint_every >= 0:
            problems.append(f"{path}.checkpoint_every={node.checkpoint_every} must be >= 0 (0 saves only at the end): pass {path}.checkpoint_every=0")
        problems += one_of(node, path, "device", DEVICES) + one_of(node, path, "precision", PRECISIONS)
        if node.compile not in COMPILE_CHOICES:
            problems.append(f"{path}.compile={node.compile!r} must be true, false or auto: pass {path}.compile=auto (or true, false)")
        elif node.compile is True and node.device != "cuda" and compiler_missing():
            problems.append(
                f"{path}.compile=true needs a C++ compiler for torch.compile's CPU kernels, and neither $CXX nor g++ is on PATH: "
                f"install one (e.g. apt-get install g++) or set CXX, or pass {path}.compile=false"
            )
        if node.device == "cuda" or node.precision == "fp16":  # torch loads only when CUDA matters
            import torch

            cuda = torch.cuda.is_available()
            if node.device == "cuda" and not cuda:
                problems.append(f"{path}.device=cuda but no CUDA device is visible: pass {path}.device=auto (or cpu)")
            elif node.precision == "fp16" and (node.device == "cpu" or not cuda):
                problems.append(
                    f"{path}.precision=fp16 needs a CUDA device (its loss scaling is a GPU feature), and this run trains on the CPU: pass {path}.precision=bf16 (or fp32)"
                )
        return problems
