"""Per-rank bytes of parameters, gradients and optimizer state, measured from the live tensors.

Sharded tensors (FSDP's DTensors, ZeRO-1's per-rank optimizer) count only the part this rank holds, so the
numbers show what each strategy saves. Framework buffers (DDP's gradient buckets, FSDP's all-gather
buffers) are not counted: these are the training state's own bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def local_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    total = 0
    for tensor in tensors:
        if isinstance(tensor, DTensor):
            tensor = tensor.to_local()
        if isinstance(tensor, torch.Tensor):
            total += tensor.numel() * tensor.element_size()
    return total


def param_bytes(model: nn.Module) -> int:
    return local_bytes(model.parameters())


def grad_bytes(model: nn.Module) -> int:
    return local_bytes(param.grad for param in model.parameters())


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The per-parameter state (Adam's moments, momentum) this rank keeps; ZeRO-1 keeps its share only."""
    local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer steps a local optimizer
    return local_bytes(value for state in local.state.values() for value in state.values() if isinstance(value, torch.Tensor) and value.dim() > 0)
