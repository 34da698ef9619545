"""ParallelState: who this process is in the job. The one object that answers rank and group questions.

It holds the job's DeviceMesh (built by ParallelDims, the only code that creates process groups) and hands
out views of it by role: `batch` (the ranks that split each global batch) and `loss` (the ranks a loss or
metric, and DDP's gradients, are averaged over: the data-parallel ranks, and the context-parallel ones with cp).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from currytrain.model.protocol import IGNORE_INDEX, scored_count
from currytrain.parallel.dims import ParallelDims

# Which mesh axis serves each role.
ROLE_AXES = {"batch": "dp", "loss": "loss", "replicate": "dp_replicate", "shard": "fsdp"}


@dataclass
class ParallelState:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    mesh: Any | None = None
    """torch DeviceMesh with axes pp, dp_replicate, dp_shard, cp, tp (and the flattened dp); None for one process."""
    dims: ParallelDims | None = None
    """The resolved degrees of the mesh; None for one process without a process group."""
    views: dict[str, Any] = field(default_factory=dict)
    """Sub-meshes of `mesh` by name (each axis, dp, fsdp): see ParallelDims.build_mesh."""
    fabric: Any | None = None
    """The lightning.fabric.Fabric that wraps the model and optimizer and runs the backward (parallel.runtime=fabric)."""

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run folder's shared files (journal, logs, resolved config)."""
        return self.rank == 0

    def view(self, role: str) -> Any:
        """The mesh of the ranks that share `role`: batch, loss, replicate, or shard (what FSDP shards over,
        2-D for HSDP); None without a mesh."""
        return None if self.mesh is None else self.views[ROLE_AXES[role]]

    @property
    def dp_rank(self) -> int:
        """This process's slice of each global batch."""
        return 0 if self.mesh is None else self.view("batch").get_local_rank()

    @property
    def dp_size(self) -> int:
        """How many slices each global batch is cut into."""
        return 1 if self.mesh is None else self.view("batch").size()

    def shard_sequence(self, tokens: torch.Tensor) -> torch.Tensor:
        """This rank's share of each sequence in `tokens` (batch, seq): its zig-zag chunks under context
        parallelism (see parallel/context.py), all of it otherwise."""
        if self.dims is None or self.dims.cp == 1:
            return tokens
        from currytrain.parallel.context import zigzag_shard

        return zigzag_shard(tokens, 1, self.views["cp"].get_local_rank(), self.dims.cp)

    def loss_context(self) -> contextlib.AbstractContextManager:
        """What the loss and its backward run inside: loss_parallel when tensor parallelism leaves the logits sharded
        over the vocabulary (the cross-entropy then reduces across the tp ranks instead of gathering the logits)."""
        if self.dims is not None and self.dims.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return contextlib.nullcontext()

    def sum_over(self, role: str, value: torch.Tensor) -> torch.Tensor:
        """`value` summed over the ranks of `role` (every rank gets the sum); unchanged for one process."""
        if self.mesh is None or self.view(role).size() == 1:
            return value
        total = value.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.view(role).get_group())
        return total

    def mean_over(self, role: str, value: torch.Tensor) -> torch.Tensor:
        """`value` averaged over the ranks of `role` (every rank gets the mean); unchanged for one process."""
        # gloo has no ReduceOp.AVG: sum, then divide.
        return value if self.mesh is None else self.sum_over(role, value) / self.view(role).size()

    def normalization(self, ignore_index: int = IGNORE_INDEX, own: bool = True) -> Normalization:
        """How a step of this process normalizes its loss: its targets counted over the loss ranks."""
        group = None if self.mesh is None or self.view("loss").size() == 1 else self.view("loss").get_group()
        return Normalization(ignore_index, group, own)

    def max_over_world(self, value: int) -> int:
        """The largest of every rank's `value` (every rank gets it); `value` for one process."""
        if self.mesh is None:
            return value
        flag = torch.tensor([value], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def gather(self, value: Any) -> list[Any]:
        """`value` from every rank of the job, in rank order (a picklable object); [value] for one process."""
        if self.mesh is None:
            return [value]
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values


@dataclass(frozen=True)
class Normalization:
    """How a step normalizes its loss (docs/training.md, "How the loss is normalized"): the loss of an optimizer step
    is the sum of every scored target's loss over all its microbatches and all the ranks that average gradients,
    divided by the number of scored targets in the step, counted once, before the first backward.

    Each microbatch's summed loss is multiplied by ranks / count before its backward: the ranks' gradient
    averaging (DDP, FSDP, the pipeline replicas, the experts' own hook) then makes the sum over every rank's
    targets divided by the count. The count is of the targets that are not `ignore_index`; a model's or data
    adapter's own loss() says what it scored (model.protocol.as_loss_sum), and where that differs from the count
    the gradients are corrected after the microbatches (a second, small all-reduce)."""

    ignore_index: int = IGNORE_INDEX
    """The targets no loss scores (the data adapter's ignore_index)."""
    group: dist.ProcessGroup | None = None
    """The ranks whose gradients are averaged (ParallelState's loss view: dp, with cp); None for one process."""
    own: bool = True
    """The loss may count its own targets (a model's or data adapter's loss()); False for the default loss, whose
    count is the step's (no check needed, no second all-reduce)."""

    @property
    def ranks(self) -> int:
        return 1 if self.group is None else dist.get_world_size(self.group)

    def count(self, targets: torch.Tensor, host: bool | None = None) -> int | torch.Tensor:
        """The scored targets of one microbatch: a host int when reading them waits for nothing (`host`; by default
        targets on the CPU, as a data loader's are), else a tensor on their device."""
        count = scored_count(targets, self.ignore_index)
        return int(count) if (targets.device.type == "cpu" if host is None else host) else count

    def total(self, local: int | torch.Tensor, device: torch.device, host: bool | None = None) -> int | torch.Tensor:
        """`local` summed over the ranks of `group`: a host int where reading the sum back waits for nothing (`host`;
        by default on the CPU), else a tensor on `device`."""
        if self.group is None:
            return local
        # torch.full fills on the device; as_tensor of a host int would copy it there and wait for the device
        value = torch.full((1,), local, dtype=torch.int64, device=device) if isinstance(local, int) else local.reshape(1).to(torch.int64).clone()
        dist.all_reduce(value, group=self.group)
        return int(value.item()) if (device.type == "cpu" if host is None else host) else value[0]


def step_scale(count: int | torch.Tensor, ranks: int) -> float | torch.Tensor:
    """What each rank's summed loss is multiplied by: ranks / the step's scored targets (a step scoring nothing
    then contributes nothing, instead of 0/0)."""
    return ranks / max(count, 1) if isinstance(count, int) else ranks / count.clamp(min=1).float()


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """trainer.device: auto picks the GPU of this local rank when CUDA is present, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(name)
