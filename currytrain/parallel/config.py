"""Typed config of the parallel group (conf/parallel/): one schema, the degrees of every mesh axis.

Every option (single, ddp, zero1, zero2, fsdp, hsdp, tp, ep, cp, pp, hybrid) is a preset of the same ParallelConfig, so axes
compose instead of one class per strategy. The checks here are torch-free (they run at validation).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from currytrain.parallel.dims import MODEL_AXES, ParallelDims, launched_world_size
from currytrain.parallel.pipeline import SCHEDULES
from currytrain.rules import bounded

RUNTIMES = ("torch", "fabric")
ZERO_STAGES = (0, 1, 2, 3)


@dataclass
class ParallelConfig:
    """How many processes train, and how the model, its gradients and its optimizer state are split among them.

    The degrees multiply to the world size (parallel.nproc, or WORLD_SIZE under torchrun / SLURM);
    one of dp_replicate / dp_shard may be -1: it takes what the others leave.
    """

    _target_: str = "currytrain.parallel.strategy.Parallel"
    nproc: int = bounded(1, ge=1)
    """Worker processes launch.py starts on this machine (ignored under torchrun/SLURM, which start them)."""
    dp_replicate: int = 1
    """Data-parallel replicas: each holds whole parameters (DDP, ZeRO-1; HSDP's outer axis). -1: the rest of the world."""
    dp_shard: int = 1
    """Data-parallel ranks that shard parameters/gradients between them (ZeRO-2/3, FSDP2). -1: the rest of the world."""
    cp: int = bounded(1, ge=1)
    """Context-parallel degree (model=gqa): each sequence is cut into 2 * cp chunks, each rank holds two (zig-zag, for
    causal balance), and causal attention runs as a ring over the cp ranks. Composes with DDP (cp2 x dp2), not tp/ep/FSDP yet."""
    tp: int = bounded(1, ge=1)
    """Tensor-parallel degree: each block's attention heads and MLP width are split over tp ranks (DTensor column/row
    parallel), the norms and the residual stream over the sequence (sequence parallel), the loss over the vocabulary
    (loss parallel). The tp ranks of a group see the same batch. model=gqa (tp divides its heads and mlp_hidden) or
    model=moe (tp divides its heads; each MoE layer is replicated over the tp ranks; no data-parallel ranks yet)."""
    pp: int = bounded(1, ge=1)
    """Pipeline-parallel degree: the decoder's layers are cut into stages run one after the other by pp ranks, trainer.grad_accum
    microbatches in flight (torch.distributed.pipelining). model=gqa; composes with data-parallel replicas (pp2 x dp2,
    zero_stage=0: stage gradients averaged over them), not tp/cp/ep/FSDP yet."""
    pp_schedule: str = "1f1b"
    """How the microbatches flow through the stages (a torch schedule): gpipe and 1f1b run one stage per pp rank;
    interleaved_1f1b, looped_bfs, interleaved_zero_bubble and zbv_zero_bubble run two (virtual stages)."""
    pp_split: list[int] | None = None
    """Layers of each stage, in stage order (one entry per stage, summing to model.n_layers); null splits evenly by layer count."""
    ep: int = bounded(1, ge=1)
    """Expert-parallel degree (model=moe): each MoE layer's experts are shared out over ep of the data-parallel ranks,
    and tokens are sent to the rank owning their expert (all_to_all). No mesh axis of its own: it divides the
    data-parallel ranks (ep=2 on 4 data-parallel ranks: 2 copies of each half of the experts). DDP only for now (not FSDP/tp)."""
    zero_stage: int = 0
    """What the data-parallel ranks split: 0 nothing (DDP), 1 optimizer state (ZeroRedundancyOptimizer),
    2 + gradients (fully_shard, parameters kept gathered between forward and backward), 3 + parameters (FSDP)."""
    runtime: str = "torch"
    """torch (curryTrain's own loop over torch.distributed), or fabric: Lightning Fabric wraps the model (DDP), the
    optimizer and the precision (32-true, bf16-mixed) and runs the backward; data parallel only (zero_stage 0)."""
    backend: str = "auto"
    """Process-group backend: auto (nccl on CUDA, gloo on CPU), gloo or nccl."""
    hang_timeout: float = bounded(1800.0, ge=0, le=1e7)
    """Seconds without a heartbeat from any worker (parallel.nproc > 1) after which the launcher declares the run
    hung: it journals `worker_hung` naming the rank the others wait for, stops every worker and fails the run.
    0 turns it off; at most 1e7 (115 days, within what a timer can wait). The default is torch's own collective timeout."""
    rendezvous_timeout: float = bounded(300.0, gt=0, le=1e7)
    """Seconds the ranks of a SLURM job (hydra/launcher=slurm, one task per rank) wait for each other at start: a
    master address that cannot be reached, or a rank that never starts, fails the job after this long, naming the
    address and the ranks seen (instead of torch retrying for half an hour). At most 1e7."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = []
        if node.zero_stage not in ZERO_STAGES:
            problems.append(f"{path}.zero_stage={node.zero_stage} is not one of {list(ZERO_STAGES)}: pass parallel=ddp|zero1|zero2|fsdp")
        if node.runtime not in RUNTIMES:
            problems.append(f"{path}.runtime={node.runtime} is not one of {list(RUNTIMES)}: pass {path}.runtime=torch")
        elif node.runtime == "fabric":
            problems += _fabric_problems(node, path)
        if node.pp_schedule not in SCHEDULES:
            problems.append(f"{path}.pp_schedule={node.pp_schedule} is not one of {list(SCHEDULES)}: pass {path}.pp_schedule=1f1b")
        if node.backend not in ("auto", "gloo", "nccl"):
            problems.append(f"{path}.backend={node.backend} is not one of ['auto', 'gloo', 'nccl']: pass {path}.backend=auto")
        if problems or node.nproc < 1 or any(node[axis] < 1 for axis in MODEL_AXES):  # out of range: the schema says so
            return problems
        return ParallelDims.problems(node, path, launched_world_size(node.nproc))


def _fabric_problems(node: Any, path: str) -> list[str]:
    """What runtime=fabric supports here: DDP over the data-parallel axes, with lightning installed."""
    problems = []
    if importlib.util.find_spec("lightning") is None:
        problems.append(
            f"{path}.runtime=fabric needs Lightning Fabric, which is not installed: pip install 'currytrain[fabric]' (or pass {path}.runtime=torch)"
        )
    if node.zero_stage != 0:
        problems.append(
            f"{path}.runtime=fabric runs DDP only (zero_stage=0), and {path}.zero_stage={node.zero_stage} shards: "
            f"pass {path}.runtime=torch for zero1/zero2/fsdp/hsdp (torch's own ZeRO and FSDP2 run on CPU and GPU), or parallel=ddp"
        )
    sharded = [axis for axis in ("cp", "tp", "pp", "ep") if node[axis] != 1]
    if sharded:
        problems.append(f"{path}.runtime=fabric runs data parallelism only: {', '.join(f'{path}.{a}={node[a]}' for a in sharded)} needs {path}.runtime=torch")
    return problems
