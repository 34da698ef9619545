"""Typed config of the training loop (the root `trainer:` node; not a group)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any

from currytrain.rules import bounded, one_of
from currytrain.weights import RESUME_MODES


def compiler_missing() -> bool:
    """True when inductor would find no C++ compiler ($CXX, else g++; clang++ on macOS). Torch-free."""
    return shutil.which(os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")) is None


DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
COMPILE_CHOICES = (True, False, "auto")
ATTENTION_PRECISIONS = ("auto", "autocast", "fp32")


@dataclass
class TrainerConfig:
    max_steps: int = bounded(1200, ge=1, le=2**53)
    """Optimizer steps to run (at most 2**53: every step count stays exact where it meets a float)."""
    batch_size: int = bounded(8, ge=1)
    """Sequences per microbatch, all data-parallel ranks together (each rank gets batch_size / dp ranks)."""
    grad_accum: int = bounded(1, ge=1, le=65536)
    """Microbatches per optimizer step; the step's loss is over the scored targets of all of them (docs/training.md).
    At most 65536: a step must end (a signal is answered between steps), and a larger batch is a larger
    trainer.batch_size."""
    grad_clip: float = bounded(1.0, ge=0)
    """Max global gradient L2 norm; 0 disables clipping."""
    eval_every: int = bounded(400, ge=1)
    """Evaluate on the val split every this many steps (and always at the end)."""
    eval_batches: int = bounded(40, ge=1, le=65536)
    """Val batches per evaluation (40 of the default 8 sequences: 320 windows, a val loss steady to about 0.02); at most 65536."""
    log_every: int = bounded(10, ge=1)
    """Send train metrics to the loggers every this many steps."""
    checkpoint_every: int = bounded(0, ge=0)
    """Save a checkpoint every this many steps; 0 saves only at the end."""
    checkpoint_on_signal: bool = True
    """On Ctrl-C, SIGTERM, SIGUSR1 or SIGUSR2 (SLURM's warnings), finish the step, save a checkpoint, then stop
    (exit 128 + the signal's number); trainer.resume=auto continues from it. False stops without saving."""
    keep_last: int = bounded(2, ge=1)
    """Complete checkpoints kept in <run>/checkpoints; older ones are deleted."""
    resume: str = "none"
    """none, auto (latest complete checkpoint of this run folder), or a path to a run folder or checkpoint.
    The config may differ from the checkpoint's: what can be applied (batch size, grad_accum, lr and schedule,
    max_steps, data, loggers...) is applied, printed and journaled (`changed_on_resume`, both values); what cannot
    (another model shape, another optimizer or its state's keys) exits 2 naming each difference and the fix."""
    resume_mode: str = "full"
    """full: continue bit for bit (weights, optimizer state, schedule, RNG, data position). weights: load the
    model weights only and start the optimizer and its LR schedule (warmup included, spanning the steps left)
    afresh, for a change of optimizer mid-project; the step count and tokens seen continue, so the folder's
    checkpoints and curves stay in order. Journaled in the `resume` event."""
    init_from: str = "none"
    """none, or model weights to start from (an `currytrain hf import` folder, a run folder or a checkpoint):
    weights only, fresh optimizer and step 0. Ignored when trainer.resume finds a checkpoint."""
    device: str = "auto"
    """auto (cuda when present, else cpu), cpu or cuda."""
    precision: str = "fp32"
    """fp32, bf16 (autocast; the weights and optimizer stay fp32), fp16 (autocast + loss scaling; CUDA only) or fp8
    (the blocks' linears in float8 through torchao, rowwise scaling, the rest under bf16 autocast; one process; needs
    `pip install 'currytrain[fp8]'`, and on a GPU compute capability 8.9+; docs/performance.md)."""
    attention_precision: str = "auto"
    """The dtype of the attention kernel under bf16/fp16/fp8 (the rest stays under autocast): autocast (16-bit),
    fp32, or auto: on one CPU process, times SDPA's forward + backward at the run's shapes in both and takes fp32
    where it is clearly faster (the CPU's 16-bit backward is slow at short sequences); elsewhere autocast. The
    journal's `attention_precision` event says which and why; a resumed run keeps its checkpoint's choice."""
    progress: bool = True
    """Show the rich progress bar (step, loss, tokens/s, ETA)."""
    compile: Any = False
    """true, false or auto. true: torch.compile the model and the loss (inductor; on CPU it needs a C++ compiler): as
    one graph in one process, block by block under parallelism (docs/performance.md). The first step pays the
    compilation (the journal's `compile` event says how long); the compiled code is cached in
    trainer.compile_cache, so a later run of the same shapes starts fast. auto (one process): times two
    eager steps, then compiles only when the eager time it expects to save over the remaining steps exceeds the
    compile cost (measured by an earlier compiled run of the same setup in that cache folder, else assumed); the
    journal's `compile_choice` event says which it chose and why."""
    compile_cache: str = ".cache/compile"
    """The folder of torch.compile's caches (inductor's graphs and kernels, and the compile costs trainer.compile=auto
    reads). Relative to the directory launch.py runs in, so every run of a project, on any day and in any run
    folder, shares it; $TORCHINDUCTOR_CACHE_DIR, when set, wins."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = one_of(node, path, "device", DEVICES) + one_of(node, path, "precision", PRECISIONS)
        problems += one_of(node, path, "resume_mode", RESUME_MODES) + one_of(node, path, "attention_precision", ATTENTION_PRECISIONS)
        if node.resume_mode == "weights" and node.resume == "none":
            problems.append(
                f"{path}.resume_mode=weights resumes the model weights of a checkpoint, and {path}.resume=none names none: pass {path}.resume=auto "
                f"(or a checkpoint), or use {path}.init_from=<weights> to start a new run from them"
            )
        if not isinstance(node.compile_cache, str) or not node.compile_cache.strip():
            problems.append(f"{path}.compile_cache={node.compile_cache!r} must name a folder: pass {path}.compile_cache=.cache/compile (the default)")
        if node.compile not in COMPILE_CHOICES:
            problems.append(f"{path}.compile={node.compile!r} must be true, false or auto: pass {path}.compile=auto (or true, false)")
        elif node.compile is True and node.device != "cuda" and compiler_missing():
            problems.append(
                f"{path}.compile=true needs a C++ compiler for torch.compile's CPU kernels, and neither $CXX nor g++ is on PATH: "
                f"install one (e.g. apt-get install g++) or set CXX, or pass {path}.compile=false"
            )
        if node.precision == "fp8" and importlib.util.find_spec("torchao") is None:
            problems.append(
                f"{path}.precision=fp8 trains float8 matmuls through torchao, which is not installed: pip install 'currytrain[fp8]' (torchao), or pass {path}.precision=bf16"
            )
        if node.device == "cuda" or node.precision in ("fp16", "fp8"):  # torch loads only when CUDA matters
            import torch

            cuda = torch.cuda.is_available()
            if node.device == "cuda" and not cuda:
                problems.append(f"{path}.device=cuda but no CUDA device is visible: pass {path}.device=auto (or cpu)")
            elif node.precision == "fp16" and (node.device == "cpu" or not cuda):
                problems.append(
                    f"{path}.precision=fp16 needs a CUDA device (its loss scaling is a GPU feature), and this run trains on the CPU: pass {path}.precision=bf16 (or fp32)"
                )
            elif node.precision == "fp8" and node.compile in (True, "auto") and (node.device == "cpu" or not cuda):
                problems.append(
                    f"{path}.precision=fp8 with {path}.compile={str(node.compile).lower()} on the CPU gives non-finite gradients (inductor's CPU float8 "
                    f"kernels, torch {torch.__version__.split('+')[0]}): pass {path}.compile=false (fp8 on the CPU is for checking a recipe), or train on a GPU"
                )
            elif node.precision == "fp8" and node.device != "cpu" and cuda and torch.cuda.get_device_capability() < (8, 9):
                major, minor = torch.cuda.get_device_capability()
                problems.append(
                    f"{path}.precision=fp8 needs float8 matmuls (compute capability 8.9+: H100, L40, RTX 4090), and this GPU has {major}.{minor}: pass {path}.precision=bf16"
                )
        return problems
