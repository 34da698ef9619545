"""Optimizer and LR-schedule builders. They receive the model, so per-parameter groups are decided here."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from currytrain.errors import ConfigError
from currytrain.model.protocol import HasMuP, HiddenMatrices, optimizer_groups
from currytrain.optim.config import warmup_steps


def param_groups(model: nn.Module, weight_decay: float, lr: float) -> list[dict]:
    """Decay matrices and embeddings; leave 1-D parameters (norm gains, biases) undecayed.

    With model.mup=true a third group holds muP's hidden matrices at lr / width_multiplier (Adam's rule:
    an update of fixed per-entry size moves a hidden layer's output by ~fan_in, so the step shrinks with
    width). The first group always runs at `lr`, which is the lr the trainer logs.

    A model that chooses its own parameters or groups (param_groups(), currytrain.model.protocol) gets them.
    """
    own = optimizer_groups(model, weight_decay, lr)
    if own is not None:
        return own
    hidden = model.mup_hidden_matrices() if isinstance(model, HasMuP) else HiddenMatrices(1.0, [])
    hidden_ids = {id(param) for param in hidden.params}
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad and id(param) not in hidden_ids:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    trainable_hidden = [param for param in hidden.params if param.requires_grad]
    if trainable_hidden:
        width = hidden.width_multiplier
        # Decoupled decay shrinks a weight by lr * weight_decay per step; keeping that product as at the
        # base width keeps the decay's timescale (in steps) the same at every width.
        groups.append({"params": trainable_hidden, "lr": lr / width, "weight_decay": weight_decay * width})
    return groups


FUSED_DEVICES = ("cpu", "cuda")
"""Devices whose tensors torch's fused AdamW kernel takes."""


def build_adamw(model: nn.Module, lr: float, betas, eps: float, weight_decay: float, implementation: str = "auto") -> torch.optim.AdamW:
    if implementation == "auto":
        devices = {param.device.type for param in model.parameters()}
        implementation = "fused" if devices <= set(FUSED_DEVICES) else "foreach"
        # Expert parallelism leaves DTensor experts beside plain parameters; the multi-tensor kernels take one kind.
        if len({isinstance(param, DTensor) for param in model.parameters()}) > 1:
            implementation = "for_loop"
    kernel = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for_loop": {"foreach": False}}[implementation]
    return torch.optim.AdamW(param_groups(model, weight_decay, lr), lr=lr, betas=tuple(betas), eps=eps, **kernel)


def build_sgd(model: nn.Module, lr: float, momentum: float, nesterov: bool, weight_decay: float) -> torch.optim.SGD:
    if isinstance(model, HasMuP) and model.mup_hidden_matrices().params:
        # muP's per-layer rules differ by optimizer; curryTrain implements Adam's only (validate.py says so first).
        raise ConfigError("model.mup=true sets Adam's per-layer learning rates: pass optimizer=adamw, or model.mup=false")
    return torch.optim.SGD(param_groups(model, weight_decay, lr), lr=lr, momentum=momentum, nesterov=nesterov)


def lr_multiplier(step: int, total_steps: int, kind: str, warmup_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak LR for optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1 - progress
    return min_lr_ratio + (1 - min_lr_ratio) * decay


def schedule_lambda(schedule, total_steps: int, start: int = 0):
    """The multiplier of optimizer step `step` (0-based) for a schedule that begins at step `start` (0, or where a
    trainer.resume_mode=weights resume started the optimizer afresh) and ends at total_steps."""
    kind, warmup, floor = schedule.kind, warmup_steps(schedule, total_steps - start), schedule.min_lr_ratio
    return lambda step: lr_multiplier(step - start, total_steps - start, kind, warmup, floor)


def build_scheduler(optimizer: torch.optim.Optimizer, schedule, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over lr_multiplier; its state (last_epoch) is checkpointed with the optimizer."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_lambda(schedule, total_steps))
