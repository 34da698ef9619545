"""One optimizer step over N microbatches: the unit the trainer and the benchmarks share."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from currytrain.model.hooks import HasAuxiliaryLoss
from currytrain.parallel.memory import grad_bytes

Batch = tuple[torch.Tensor, torch.Tensor]


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats; logits are upcast so bf16 autocast keeps an fp32 loss.
    Any leading shape works: a decoder's (batch, seq, vocab) against (batch, seq), a classifier's
    (batch, classes) against (batch,)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


@dataclass
class StepResult:
    loss: float
    """Mean loss over the microbatches (nats/token)."""
    grad_norm: float
    """Global L2 norm of the gradients before clipping."""
    skipped: bool
    """True when the gradients were not finite and the optimizer step was skipped."""
    num_tokens: int
    """Target tokens processed in the step."""
    grad_bytes: int | None = None
    """Bytes of the gradients this rank held before the optimizer step (when measure_grads)."""


@dataclass
class DeviceStep:
    """A step's results still on the device: reading them waits for the device, so the trainer fetches them
    only at log steps (fetch_steps)."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    skipped: torch.Tensor
    """1.0 where the optimizer step was skipped (non-finite gradients), else 0.0."""
    num_tokens: int
    grad_bytes: int | None = None

    def fetch(self) -> StepResult:
        return fetch_steps([self])[0]


def fetch_steps(steps: Sequence[DeviceStep]) -> list[StepResult]:
    """The results of several steps with one device-to-host copy."""
    if not steps:
        return []
    values = torch.stack([torch.stack([s.loss, s.grad_norm.to(s.loss.dtype), s.skipped.to(s.loss.dtype)]) for s in steps]).tolist()
    return [
        StepResult(loss=loss, grad_norm=norm, skipped=bool(skipped), num_tokens=step.num_tokens, grad_bytes=step.grad_bytes)
        for (loss, norm, skipped), step in zip(values, steps)
    ]


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` can skip a step on the device: torch's fused Adam/AdamW/SGD read a `found_inf`
    tensor and leave the parameters, moments and step count untouched where it is nonzero."""
    return type(optimizer) in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD) and bool(optimizer.defaults.get("fused"))


def run_accumulated_step(model: nn.Module, optimizer: torch.optim.Optimizer, microbatches: Sequence[Batch], **options) -> StepResult:
    """One optimizer step (see accumulated_step) with its results read back: waits for the device."""
    return accumulated_step(model, optimizer, microbatches, **options).fetch()


def accumulated_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    microbatches: Sequence[Batch],
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = causal_lm_loss,
    grad_clip: float = 0.0,
    autocast_dtype: torch.dtype | None = None,
    measure_grads: bool = False,
    scaler: torch.amp.GradScaler | None = None,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
) -> DeviceStep:
    """Forward+backward each microbatch with its loss scaled by 1/N, then clip and take one optimizer step,
    unless the gradients are not finite.

    A model with auxiliary_loss() (MoE balancing) has it added to each microbatch's loss. `backward` runs each
    microbatch's backward (Fabric's under parallel.runtime=fabric).

    Scaling each microbatch loss by 1/N makes the accumulated gradient equal to the gradient of
    the mean loss over the concatenated batch (for equal-sized microbatches).

    With an optimizer that skips on the device (skips_on_device: fused AdamW, the default) nothing here waits
    for the device; otherwise the finiteness check reads the gradient norm back once.
    """
    num_micro = len(microbatches)
    assert num_micro >= 1, "need at least one microbatch"
    device = next(model.parameters()).device
    total_loss = torch.zeros((), device=device)
    num_tokens = 0
    for inputs, targets in microbatches:
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        autocast = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
        with autocast:
            task_loss = loss_fn(model(inputs), targets)
            loss = task_loss + model.auxiliary_loss() if isinstance(model, HasAuxiliaryLoss) else task_loss
        # fp16: the loss is scaled up so that small gradients do not underflow; unscaled before clipping.
        backward(scaler.scale(loss / num_micro) if scaler is not None else loss / num_micro)
        # The reported loss is the task loss alone, so runs with and without auxiliary losses compare.
        total_loss += task_loss.detach() / num_micro
        num_tokens += targets.numel()

    if scaler is not None:
        scaler.unscale_(optimizer)
    # clip_grad_norm_ with an infinite bound measures the norm without changing the gradients.
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if isinstance(grad_norm, DTensor):  # FSDP: each rank holds part of the norm; the whole is needed here
        grad_norm = grad_norm.full_tensor()
    found_inf = (~torch.isfinite(grad_norm)).float()
    if scaler is None and skips_on_device(optimizer):
        optimizer.found_inf = found_inf
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif not math.isfinite(grad_norm.item()):  # the one read-back of this path: whether to step at all
        pass
    elif scaler is not None:
        scaler.step(optimizer)
    else:
        optimizer.step()
    if scaler is not None:
        scaler.update()  # a skipped (overflowing) step lowers the scale
    held = grad_bytes(model) if measure_grads else None  # gradients are freed just below
    optimizer.zero_grad(set_to_none=True)
    return DeviceStep(loss=total_loss, grad_norm=grad_norm.detach(), skipped=found_inf, num_tokens=num_tokens, grad_bytes=held)
