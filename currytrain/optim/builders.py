"""Optimizer and LR-schedule builders. They receive the model, so per-parameter groups are decided here."""

from __future__ import annotations

import math

import torch
from torch import nn

SCHEDULE_KINDS = ("cosine", "linear", "constant")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices and embeddings; leave 1-D parameters (norm gains, biases) undecayed."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_adamw(model: nn.Module, lr: float, betas, eps: float, weight_decay: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas), eps=eps)


def build_sgd(model: nn.Module, lr: float, momentum: float, nesterov: bool, weight_decay: float) -> torch.optim.SGD:
    return torch.optim.SGD(param_groups(model, weight_decay), lr=lr, momentum=momentum, nesterov=nesterov)


def lr_multiplier(step: int, total_steps: int, kind: str, warmup_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak LR for optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1 - progress
    return min_lr_ratio + (1 - min_lr_ratio) * decay


def build_scheduler(optimizer: torch.optim.Optimizer, schedule, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over lr_multiplier; its state (last_epoch) is checkpointed with the optimizer."""
    kind, warmup, floor = schedule.kind, schedule.warmup_steps, schedule.min_lr_ratio
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, total_steps, kind, warmup, floor))
