"""ParallelDims: the degrees of every device-mesh axis as data, checked against the world size.

The one place that creates process groups (through init_device_mesh) and hands out mesh views by role.
Torch-free to import: validation uses the checks before any process group exists.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

# Mesh axes, outermost first (torchtitan's order). ep is no axis of this mesh: it splits the data-parallel ranks
# (see build_mesh).
AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
DP_AXES = ("dp_replicate", "dp_shard")
MODEL_AXES = ("cp", "tp", "pp", "ep")


def launched_world_size(nproc: int) -> int:
    """The world this run will have: WORLD_SIZE when torchrun/SLURM started the process, else parallel.nproc."""
    return int(os.environ.get("WORLD_SIZE", nproc))


@dataclass(frozen=True)
class ParallelDims:
    """Resolved degrees (no -1 left) of one job; their product is the world size."""

    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    ep: int
    world_size: int

    @staticmethod
    def problems(node: Any, path: str, world_size: int) -> list[str]:
        """Every problem of the degrees in `node` (a parallel config) for a job of `world_size` processes."""
        problems = []
        for axis in MODEL_AXES:
            if node[axis] < 1:
                problems.append(f"{path}.{axis}={node[axis]} must be >= 1: pass {path}.{axis}=1 (off) or a degree that divides the world size")
        for axis in DP_AXES:
            if node[axis] < 1 and node[axis] != -1:
                problems.append(f"{path}.{axis}={node[axis]} must be >= 1, or -1 for the rest of the world: pass {path}.{axis}=-1")
        if node.dp_replicate == node.dp_shard == -1:
            problems.append(f"{path}.dp_replicate and {path}.dp_shard are both -1: set one of them, e.g. {path}.dp_replicate=1")
        if node.zero_stage in (0, 1) and node.dp_shard != 1:
            problems.append(
                f"{path}.zero_stage={node.zero_stage} replicates the model on every data-parallel rank, so {path}.dp_shard={node.dp_shard} has nothing to shard: "
                f"pass {path}.dp_shard=1 {path}.dp_replicate=-1, or {path}.zero_stage=3 (fsdp/hsdp)"
            )
        if problems:
            return problems
        fixed = math.prod(max(node[axis], 1) for axis in (*DP_AXES, "cp", "tp", "pp"))
        where = f"the world size is {world_size} ({'WORLD_SIZE' if 'WORLD_SIZE' in os.environ else f'{path}.nproc={node.nproc}'})"
        degrees = " x ".join(f"{path}.{axis}={node[axis]}" for axis in (*DP_AXES, "tp", "pp") if axis in DP_AXES or node[axis] > 1)
        if -1 in (node.dp_replicate, node.dp_shard):
            if world_size % fixed:
                return [f"{degrees} cannot fill the world: {where}, which {fixed} does not divide: pass {path}.nproc={fixed} (or a multiple)"]
        elif fixed != world_size:
            return [f"{degrees} = {fixed} processes, but {where}: pass {path}.nproc={fixed}, or degrees whose product is {world_size}"]
        dims = ParallelDims.resolve(node, world_size)
        if dims.pp > 1 and (dims.cp > 1 or dims.tp > 1 or dims.ep > 1):
            others = ", ".join(f"{path}.{axis}={getattr(dims, axis)}" for axis in ("cp", "tp", "ep") if getattr(dims, axis) > 1)
            return [
                f"{path}.pp={node.pp} composes with data parallelism only for now, not {others}: "
                f"pass parallel=pp {path}.nproc={world_size} (pp={dims.pp} x dp={world_size // dims.pp}), or {path}.pp=1"
            ]
        if dims.pp > 1 and node.zero_stage != 0:
            return [
                f"{path}.pp={node.pp} replicates its stages over the data-parallel ranks (DDP-like, zero_stage=0) for now, not "
                f"{path}.zero_stage={node.zero_stage}: pass {path}.zero_stage=0 {path}.dp_shard=1 {path}.dp_replicate={dims.dp_size}"
            ]
        if dims.ep > 1 and (dims.dp_size % dims.ep or dims.dp_size != world_size):
            return [
                f"{path}.ep={node.ep} splits the data-parallel ranks ({dims.dp_size} here, of a world of {world_size}) and composes with data parallelism "
                f"only for now: pass {path}.ep in {[d for d in range(1, dims.dp_size + 1) if dims.dp_size % d == 0]} with {path}.tp=1"
            ]
        if dims.cp > 1 and (dims.tp > 1 or dims.ep > 1 or node.zero_stage != 0):
            return [f"{path}.cp={node.cp} composes with DDP (zero_stage=0) only for now: pass parallel=cp, or {path}.tp=1 {path}.ep=1 {path}.zero_stage=0"]
        if dims.ep > 1 and node.zero_stage != 0:
            return [
                f"{path}.ep={node.ep} runs under DDP (zero_stage=0) for now, not {path}.zero_stage={node.zero_stage}: pass parallel=ep, or {path}.zero_stage=0"
            ]
        if dims.tp > 1 and (node.zero_stage == 1 or (node.zero_stage == 0 and dims.dp_size > 1)):
            return [
                f"{path}.tp={node.tp} with {path}.zero_stage={node.zero_stage} over {dims.dp_size} data-parallel ranks: DDP and ZeRO-1 do not take "
                f"tensor-parallel (DTensor) parameters; pass parallel=hybrid (FSDP over the data-parallel ranks: {path}.zero_stage=3 {path}.dp_shard=-1 {path}.dp_replicate=1)"
            ]
        return []

    @classmethod
    def resolve(cls, node: Any, world_size: int) -> ParallelDims:
        """The degrees of `node` with its -1 filled in; call after problems() came back empty."""
        degrees = {axis: int(node[axis]) for axis in (*DP_AXES, *MODEL_AXES)}
        rest = world_size // math.prod(max(value, 1) for axis, value in degrees.items() if axis != "ep")
        degrees = {axis: rest if value == -1 else value for axis, value in degrees.items()}
        return cls(world_size=world_size, **degrees)

    @property
    def dp_size(self) -> int:
        return self.dp_replicate * self.dp_shard

    def build_mesh(self, device_type: str) -> tuple[Any, dict[str, Any]]:
        """The job's one DeviceMesh (axes pp, dp_replicate, dp_shard, cp, tp) and its views by name: each
        axis, `dp` (both data-parallel axes flattened), `loss` (dp and cp flattened) and `fsdp` (what fully_shard
        shards over); with ep, `ep` and `ep_replicate` from a second mesh over the same ranks.

        init_device_mesh creates every process group the job uses; nothing else calls dist.new_group.
        """
        from torch.distributed.device_mesh import init_device_mesh

        shape = tuple(getattr(self, axis) for axis in AXES)
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=AXES)
        views = {axis: mesh[axis] for axis in AXES}
        # The batch is split over both data-parallel axes together; losses are averaged over the same ranks.
        views["dp"] = mesh[DP_AXES]._flatten("dp")
        # Context parallelism splits each sequence as well: a loss (and the gradients) is averaged over dp x cp.
        views["loss"] = mesh[(*DP_AXES, "cp")]._flatten("dp_cp") if self.cp > 1 else views["dp"]
        # dp_shard alone is FSDP; with replicas too the 2-D view makes fully_shard HSDP.
        views["fsdp"] = mesh[DP_AXES] if self.dp_replicate > 1 else mesh["dp_shard"]
        if self.ep > 1:
            # Expert parallelism regroups the data-parallel ranks (the whole world: validation keeps ep to pure data
            # parallelism) as (ep_replicate, ep): consecutive ranks share out the experts, every ep-th rank holds the same.
            experts = init_device_mesh(device_type, (self.world_size // self.ep, self.ep), mesh_dim_names=("ep_replicate", "ep"))
            views["ep"], views["ep_replicate"] = experts["ep"], experts["ep_replicate"]
        return mesh, views
