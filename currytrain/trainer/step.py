"""One optimizer step over N microbatches: the unit the trainer and the benchmarks share."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from currytrain.model.protocol import ForwardLoss, LossFn, full, model_loss, own_loss, token_loss_sum
from currytrain.parallel.memory import grad_bytes
from currytrain.parallel.state import Normalization, step_scale

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from currytrain.parallel.stages import PipelineRunner

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class StepResult:
    loss: float
    """The step's loss (nats per scored target): this rank's summed task loss times ranks / scored targets, which
    averaged over the loss ranks (as the trainer reports it) is the whole step's (see Normalization)."""
    grad_norm: float
    """Global L2 norm of the gradients before clipping."""
    skipped: bool
    """True when the gradients were not finite and the optimizer step was skipped."""
    num_tokens: int
    """Target tokens processed in the step."""
    grad_bytes: int | None = None
    """Bytes of the gradients this rank held before the optimizer step (when measure_grads)."""


def clip_grad_norm(parameters: list[torch.Tensor], max_norm: float, across: dist.ProcessGroup | None = None) -> torch.Tensor:
    """torch's clip_grad_norm_ (returns the global L2 norm before clipping), also over parameters that mix plain
    tensors and DTensors of different meshes (expert parallelism shards the experts, DDP replicates the rest):
    each kind's norm is taken apart, made whole (a sharded DTensor's norm sums every rank's part), then combined.

    across: the ranks that hold the other parts of the model as plain tensors (the pipeline stages): the norm is over
    all of their gradients, and every rank clips by that same norm."""
    if across is None:
        kinds: dict[object, list[torch.Tensor]] = {}
        for param in parameters:
            if param.grad is not None:
                kinds.setdefault(param.grad.device_mesh if isinstance(param.grad, DTensor) else None, []).append(param)
        if len(kinds) > 1:
            return _clip_kinds_apart(kinds, max_norm)
    # One kind (the usual case) or the pipeline's stages: torch's clip_grad_norm_ (its norm, then
    # clip_grads_with_norm_), the norm taken by grad_norm.
    total = grad_norm(parameters, across)
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return full(total)


def _clip_kinds_apart(kinds: dict[object, list[torch.Tensor]], max_norm: float) -> torch.Tensor:
    """clip_grad_norm over parameters of several kinds (plain tensors, DTensors of each mesh): each kind's norm made
    whole, the norms combined, every gradient scaled by the one factor."""
    norms = [full(torch.nn.utils.get_total_norm([param.grad for param in group])) for group in kinds.values()]
    total = torch.linalg.vector_norm(torch.stack(norms))
    scale = max_norm / (total.item() + 1e-6)
    if scale < 1:
        for group in kinds.values():
            for param in group:
                param.grad.mul_(scale)
    return total


def optimizer_step(optimizer: torch.optim.Optimizer, found_inf: torch.Tensor | None, grad_scale: torch.Tensor | None) -> None:
    """optimizer.step() of a fused kernel, with its found_inf and grad_scale (those given) set for this call only."""
    extra = {name: value for name, value in (("found_inf", found_inf), ("grad_scale", grad_scale)) if value is not None}
    vars(optimizer).update(extra)
    try:
        optimizer.step()
    finally:
        for name in extra:
            delattr(optimizer, name)


def grad_norm(parameters: list[torch.Tensor], across: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The L2 norm of the gradients (of the parameters that have one), over `across`'s ranks too: torch's
    get_total_norm (a DTensor's norm stays a DTensor for the caller to make whole)."""
    grads = [param.grad for param in parameters if param.grad is not None]
    if grads and all(type(grad) is torch.Tensor and grad.device.type == "cpu" for grad in grads):
        # get_total_norm keeps torch._foreach_norm for accelerators and loops over CPU tensors in Python; the
        # foreach op's CPU fallback runs the same per-tensor kernels in one C++ loop: the same norm, ~100 us less
        # a step on TINY's 21 tensors (a third of the norm's time).
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    else:
        total = torch.nn.utils.get_total_norm(grads)
    if across is not None:
        squared = total**2
        dist.all_reduce(squared, group=across)
        total = squared.sqrt()
    return total


def read_without_waiting(tensor: torch.Tensor | torch.device) -> bool:
    """Whether reading `tensor` (or a tensor on this device) on the host waits for nothing: a CPU tensor is computed
    by the time it is read, an accelerator's may still be queued behind the step's kernels."""
    return getattr(tensor, "device", tensor).type == "cpu"


def clip_divisor(norm: torch.Tensor | float, max_norm: float) -> torch.Tensor | float:
    """What the gradients are divided by to clip them to `max_norm`: 1/clip_grad_norm_'s factor (>= 1), of the
    norm on the device or read back to the host."""
    divisor = (norm + 1e-6) / max_norm
    return torch.clamp(divisor, min=1.0) if isinstance(divisor, torch.Tensor) else max(divisor, 1.0)


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
    tensor and leave the parameters, moments and step count untouched where it is nonzero. Each group is
    asked, not the defaults: a loaded optimizer state brings the saving run's kernel choice with it."""
    fused = all(group.get("fused") for group in optimizer.param_groups)
    return type(optimizer) in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD) and fused


def run_accumulated_step(model: nn.Module, optimizer: torch.optim.Optimizer, microbatches: Sequence[Batch], **options) -> StepResult:
    """One optimizer step (see accumulated_step) with its results read back: waits for the device."""
    return accumulated_step(model, optimizer, microbatches, **options).fetch()


def backward_microbatches(
    microbatches: Sequence[Batch],
    forward: ForwardLoss,
    normalization: Normalization,
    device: torch.device,
    *,
    autocast_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    loss_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    parameters: Sequence[torch.Tensor] = (),
) -> torch.Tensor:
    """Forward and backward of every microbatch with the step's normalization, gradients accumulated in the
    parameters; returns this rank's share of the step's task loss (see StepResult.loss), on the device.

    A model's auxiliary loss (MoE balancing: a mean over its microbatch's tokens) is divided by the number of
    microbatches, so the step trains on its average over them (and over the ranks, by the gradient averaging).
    `parameters`: those whose gradients a loss that counts its own targets may have to correct."""
    num_micro = len(microbatches)
    # Counted where reading them waits for nothing (a data loader's targets on the host), summed over the ranks on
    # the device; an accelerator's sum stays there (the scale is then a tensor: no wait).
    host = read_without_waiting(microbatches[0][1])
    counts = [normalization.count(targets, host) for _, targets in microbatches]
    step_count = normalization.total(sum(counts), device, read_without_waiting(device))
    scale = step_scale(step_count, normalization.ranks)
    totals, own_counts = [], []
    auxiliary_seen = counted_by_loss = False
    for (inputs, targets), count in zip(microbatches, counts):
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        autocast = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
        with loss_context():
            with autocast:
                task, auxiliary = forward(inputs, targets)
            # full(): under tensor parallelism the task loss is a DTensor (loss_parallel).
            total = full(task.total)
            loss = total * scale
            if auxiliary is not None:
                loss = loss + (auxiliary / num_micro if num_micro > 1 else auxiliary)
            # fp16: the loss is scaled up so that small gradients do not underflow; unscaled before clipping.
            backward(scaler.scale(loss) if scaler is not None else loss)
        # The reported loss is the task loss alone, so runs with and without auxiliary losses compare.
        totals.append(total.detach().float())
        own_counts.append(count if task.counted_as_step else task.count)
        auxiliary_seen = auxiliary_seen or auxiliary is not None
        counted_by_loss = counted_by_loss or not task.counted_as_step
    summed = totals[0] if num_micro == 1 else torch.stack(totals).sum()
    # A loss that counted its own targets (its form is its code's, the same on every rank): the gradients are put
    # right after the microbatches where its count differs from the step's.
    if normalization.own and counted_by_loss:
        correction = own_count_correction(own_counts, step_count, normalization, device)
        if correction is not None:
            correct_gradients(parameters, correction)
            if auxiliary_seen:
                _warn_auxiliary_corrected()
            return summed * (scale * correction)
    return summed * scale


def _warn_auxiliary_corrected() -> None:
    if not _SAID:
        _SAID.append(True)
        log.warning(
            "a loss() counted other targets than the step (a mask of its own): the gradients were scaled after the backward, the "
            "auxiliary loss's with them. Mark the targets it does not score with the data adapter's ignore_index, so that the step "
            'counts them before the backward (docs/training.md, "How the loss is normalized")'
        )


_SAID: list[bool] = []


def own_count_correction(counts: list, step_count: int | torch.Tensor, normalization: Normalization, device: torch.device) -> float | torch.Tensor | None:
    """step_count / the targets the losses say they scored (summed over the ranks): what the gradients are
    multiplied by when a loss() counted other targets than the step did; None where they agree (on the CPU, read
    on the host), so nothing is touched."""
    local = sum(int(count) if not isinstance(count, torch.Tensor) or read_without_waiting(count) else count for count in counts)
    scored = normalization.total(local, device, read_without_waiting(device))
    if isinstance(scored, int) and isinstance(step_count, int):
        return None if scored == step_count else max(step_count, 1) / max(scored, 1)
    return torch.as_tensor(step_count, device=device).clamp(min=1).float() / torch.as_tensor(scored, device=device).clamp(min=1).float()


def correct_gradients(parameters: Sequence[torch.Tensor], factor: float | torch.Tensor) -> None:
    for param in parameters:
        if param.grad is not None:
            param.grad.mul_(factor)


def accumulated_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    microbatches: Sequence[Batch],
    *,
    loss_fn: LossFn = token_loss_sum,
    forward_loss: ForwardLoss | None = None,
    normalization: Normalization | None = None,
    grad_clip: float = 0.0,
    autocast_dtype: torch.dtype | None = None,
    measure_grads: bool = False,
    scaler: torch.amp.GradScaler | None = None,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    loss_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    pipeline: PipelineRunner | None = None,
    parameters: Sequence[torch.Tensor] | None = None,
) -> DeviceStep:
    """Forward+backward each microbatch (backward_microbatches: the loss normalized over the step's scored
    targets), then clip and take one optimizer step, unless the gradients are not finite.

    `forward_loss` runs a microbatch's forward and loss (Components.forward_loss: compiled as one graph under
    trainer.compile on one process); by default model_loss(model, loss_fn), where `loss_fn` sums over the targets it
    scores (token_loss_sum: a mean, such as causal_lm_loss, would be divided twice). `normalization` says how the targets
    are counted and over which ranks (Components.normalization); by default one process, ignore index -100, the
    loss of `model` (its own loss() counting its targets when it has one). `backward` runs each microbatch's
    backward (Fabric's under parallel.runtime=fabric). `loss_context` makes the context each microbatch's forward,
    loss and backward run in (ParallelState.loss_context: loss_parallel under tensor parallelism).

    `pipeline` (pipeline parallelism): its schedule runs the microbatches through this rank's stages instead of the
    loop here (loss on the last stage, broadcast to every stage); the gradient norm is over every stage's parameters.

    With an optimizer that skips on the device (skips_on_device: fused AdamW, the default) nothing here waits
    for an accelerator; otherwise, and on the CPU (read_without_waiting), the finiteness check reads the gradient
    norm back once. Such an optimizer also clips: its kernel divides the gradients by clip_divisor as it reads them.

    `parameters`: list(model.parameters()), which a caller stepping the same model many times keeps (listing them
    is ~1% of a tiny model's step on the CPU).
    """
    assert len(microbatches) >= 1, "need at least one microbatch"
    parameters = list(model.parameters()) if parameters is None else parameters
    device = parameters[0].device
    if normalization is None:
        normalization = Normalization(own=forward_loss is not None or own_loss(model) is not None)
    num_tokens = sum(targets.numel() for _, targets in microbatches)
    if pipeline is not None:
        total_loss = pipeline.step(microbatches, device, normalization, autocast_dtype)
    else:
        forward = forward_loss or model_loss(model, loss_fn)
        total_loss = backward_microbatches(
            microbatches,
            forward,
            normalization,
            device,
            autocast_dtype=autocast_dtype,
            scaler=scaler,
            backward=backward,
            loss_context=loss_context,
            parameters=parameters,
        )

    if scaler is not None:
        scaler.unscale_(optimizer)
    across = pipeline.group if pipeline is not None else None
    fused = scaler is None and skips_on_device(optimizer)
    own_norm = (fused or grad_clip <= 0) and not any(isinstance(param, DTensor) for param in parameters)
    divides = own_norm and fused and grad_clip > 0
    if own_norm:
        # The fused kernel divides each gradient by grad_scale as it reads it (GradScaler's unscaling), so the
        # clipping rides along instead of taking a pass of its own over the gradients (torch's clip_grad_norm_
        # multiplies every one, by 1 where it does not clip).
        norm = grad_norm(parameters, across)
    else:  # DTensors (clip_grad_norm combines their meshes), or an optimizer that cannot divide
        norm = clip_grad_norm(parameters, grad_clip if grad_clip > 0 else float("inf"), across)
    if fused and not read_without_waiting(norm):  # the kernel also skips the step where found_inf is set: nothing waits
        skipped = (~torch.isfinite(norm)).float()
        optimizer_step(optimizer, skipped, clip_divisor(norm, grad_clip) if divides else None)
    else:
        # The one read-back of this path: whether to step at all. On the CPU it waits for nothing, and the
        # finiteness and the clip divisor are host arithmetic instead of a handful of scalar kernels and the
        # fused kernel's found_inf undo of every step count (~200 us of TINY's step).
        value = norm.item()
        finite = math.isfinite(value)
        if not finite:
            pass
        elif fused:
            divisor = clip_divisor(value, grad_clip) if divides else 1.0
            optimizer_step(optimizer, None, torch.tensor(divisor, dtype=torch.float32) if divisor > 1 else None)
        elif scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()
        skipped = torch.tensor(0.0 if finite else 1.0, device=norm.device)
    if scaler is not None:
        scaler.update()  # a skipped (overflowing) step lowers the scale
    held = grad_bytes(model) if measure_grads else None  # gradients are freed just below
    optimizer.zero_grad(set_to_none=True)
    return DeviceStep(loss=total_loss, grad_norm=norm.detach(), skipped=skipped, num_tokens=num_tokens, grad_bytes=held)
