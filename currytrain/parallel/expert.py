"""Expert parallelism for model=moe: each rank of the ep axis owns num_experts / ep of every MoE layer's experts.

The ep ranks are data-parallel ranks (each routes its own tokens). Per MoE layer and forward pass:
  1. the router runs locally and groups this rank's assignments by expert (the model's own dispatch);
  2. all_to_all_single swaps the per-expert counts, then the token rows themselves (uneven splits), so each
     rank receives every rank's rows for the experts it owns;
  3. the owned experts run on those rows (one matmul per expert, dropless), and a second all_to_all_single
     sends each result back to the rank its token came from, where the model combines it as usual.
The exchanges are autograd-aware (torch.distributed.nn.functional): backward runs the same trip in reverse.

The stacked expert weights become DTensors sharded over experts (Shard(0)) on the ep mesh, so checkpoints hold
whole tensors that any layout loads (DCP reshards), and the gradient norm sums every rank's experts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.nn.functional import all_to_all_single
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from currytrain.model.moe import GroupedExperts


class ExpertParallelExperts(GroupedExperts):
    """A GroupedExperts whose experts live across the ep ranks: forward_grouped takes this rank's rows grouped by
    (global) expert and returns their outputs in the same order, wherever the experts ran.

    dp_size: the data-parallel ranks the batch is split over. Each rank's loss is its summed loss times dp_size / the
    step's scored targets (trainer.step: the loss rule), so the expert gradients (which collect every rank's tokens)
    are divided by dp_size, as DDP averages the others.
    replicas: the mesh of ranks holding the same experts (dp_size / ep of them); their gradients are summed.
    """

    def __init__(self, experts: GroupedExperts, ep_mesh, replicas, dp_size: int):
        nn.Module.__init__(self)
        self.num_experts = experts.num_experts
        self.ep_size = ep_mesh.size()
        self.num_local = self.num_experts // self.ep_size
        self.group = ep_mesh.get_group()
        self.replica_group = replicas.get_group() if replicas.size() > 1 else None
        self.dp_size = dp_size
        self.act = experts.act
        for name in ("w1", "w3", "w2"):
            param = nn.Parameter(distribute_tensor(getattr(experts, name).detach(), ep_mesh, [Shard(0)]))
            param.register_hook(self._average)
            setattr(self, name, param)

    def _average(self, grad: DTensor) -> DTensor:
        local = grad.to_local()
        if self.replica_group is not None:
            local = local.clone()
            dist.all_reduce(local, group=self.replica_group)
        return DTensor.from_local(local / self.dp_size, grad.device_mesh, grad.placements, run_check=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("expert parallelism is dropless (model.capacity_factor=0); validation refuses a capacity")

    def forward_grouped(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        sent = counts.clone()
        received = torch.empty_like(sent)
        dist.all_to_all_single(received, sent, group=self.group)  # [source rank, owned expert] counts
        received = received.view(self.ep_size, self.num_local)
        send_splits = sent.view(self.ep_size, self.num_local).sum(1).tolist()
        recv_splits = received.sum(1).tolist()
        inbound = self._exchange(x, recv_splits, send_splits)
        # Rows arrive grouped by source rank, then expert: regroup them by expert for the matmuls, and back.
        order = _expert_major(received)
        out = self._run_owned(inbound.index_select(0, order), received.sum(0).tolist())
        back = torch.empty_like(out).index_copy(0, order, out)
        return self._exchange(back, send_splits, recv_splits)

    def _exchange(self, rows: torch.Tensor, recv_splits: list[int], send_splits: list[int]) -> torch.Tensor:
        output = rows.new_empty(sum(recv_splits), rows.shape[1])
        return all_to_all_single(output, rows, recv_splits, send_splits, group=self.group)

    def _run_owned(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """The owned experts on their rows (counts[e] rows for owned expert e, in order)."""
        weights = (self.w1.to_local(), self.w3.to_local(), self.w2.to_local())
        outputs = [
            F.linear(self.act(F.linear(rows, w1)) * F.linear(rows, w3), w2) for rows, w1, w3, w2 in zip(x.split(counts), *(w.unbind(0) for w in weights))
        ]
        return torch.cat(outputs)


def _expert_major(counts: torch.Tensor) -> torch.Tensor:
    """For rows laid out by (source, expert) blocks of sizes counts[source, expert]: the row indices that list them
    by (expert, source) instead."""
    sizes = counts.flatten()
    starts = torch.cumsum(sizes, 0) - sizes
    starts, sizes = starts.view_as(counts).t().flatten().tolist(), counts.t().flatten().tolist()
    return torch.cat([torch.arange(start, start + size, device=counts.device) for start, size in zip(starts, sizes)])


def sum_counts(group) -> callable:
    """The MoE layers' reduce_counts under expert (or data) parallelism: per-expert counts summed over `group`, so
    the balance loss and the load metrics describe the global batch."""

    def reduce(counts: torch.Tensor) -> torch.Tensor:
        total = counts.clone()
        dist.all_reduce(total, group=group)
        return total

    return reduce
