"""Grouped linear: one matmul per expert over its contiguous rows, as one opaque torch operator.

Dropless MoE dispatch sorts the T * top_k assignments by expert, so expert e's rows are a contiguous slice whose
length is only known from the routing. Splitting them in Python needs the lengths on the host (`counts.tolist()`),
which torch.compile cannot trace: dynamo breaks the graph there, once per MoE layer, and compiles the pieces apart.
Registered as a custom operator (torch.library), the grouped matmul keeps static shapes at its boundary ((N, in)
-> (N, out), whatever the split), so dynamo traces the routing, the sort, the gather, the experts and the combine of
every layer into one graph; the split sizes are read inside the operator, where eager code reads them today.
This is the contract of torch's own `torch.nn.functional.grouped_mm` (offsets as a tensor), which on this torch
runs bf16 on CUDA only; the operator here runs every dtype on every device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.library.custom_op("currytrain::grouped_linear", mutates_args=())
def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """x: (N, in) rows grouped by group, counts[g] rows for group g; weight: (G, out, in) -> (N, out)."""
    sizes = counts.tolist()
    outputs = [F.linear(rows, w) for rows, w in zip(x.split(sizes), weight.unbind(0))]
    return torch.cat(outputs) if outputs else x.new_empty(0, weight.shape[1])


@_grouped_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[1])


@torch.library.custom_op("currytrain::grouped_weight_grad", mutates_args=())
def _grouped_weight_grad(grad: torch.Tensor, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The weight gradient of grouped_linear: (G, out, in), group g's grad_rows^T @ x_rows (zero for an empty group)."""
    sizes = counts.tolist()
    return torch.stack([g.t() @ rows for g, rows in zip(grad.split(sizes), x.split(sizes))])


@_grouped_weight_grad.register_fake
def _(grad: torch.Tensor, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return grad.new_empty(counts.shape[0], grad.shape[1], x.shape[1])


def _setup_context(ctx, inputs, output) -> None:
    x, weight, counts = inputs
    ctx.save_for_backward(x, weight, counts)


def _backward(ctx, grad: torch.Tensor):
    x, weight, counts = ctx.saved_tensors
    grad_x = _grouped_linear(grad, weight.transpose(1, 2), counts) if ctx.needs_input_grad[0] else None
    grad_weight = _grouped_weight_grad(grad, x, counts) if ctx.needs_input_grad[1] else None
    return grad_x, grad_weight, None


_grouped_linear.register_autograd(_backward, setup_context=_setup_context)


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """F.linear(x_g, weight[g]) for each group g's contiguous rows x_g of x, concatenated: (N, in) -> (N, out).

    counts: (G,) rows per group, a tensor (they stay on the device until the operator reads them). Under autocast
    the operands are cast to its dtype first, as F.linear would be (a custom operator is not autocast itself)."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        x, weight = x.to(dtype), weight.to(dtype)
    return _grouped_linear(x, weight, counts)
