"""The model protocol: what the trainer, the ladder and the benchmarks ask of a model, and the loss they
train it on when it offers none.

A model is an `nn.Module` whose forward maps inputs to logits. It may also offer the optional methods below,
each checked for by type (a runtime-checkable Protocol), never by name or attribute:

- auxiliary_loss() -> Tensor: extra losses of the last forward (MoE balancing), added before backward;
- training_metrics() -> dict[str, float]: statistics of the last forward, logged with the train metrics;
- mup_hidden_matrices() -> HiddenMatrices: the weights muP trains with a width-scaled learning rate.

This module imports torch but not torch.distributed: a model knows nothing of how it is parallelized.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn


@runtime_checkable
class HasAuxiliaryLoss(Protocol):
    def auxiliary_loss(self) -> torch.Tensor: ...


@runtime_checkable
class HasTrainingMetrics(Protocol):
    def training_metrics(self) -> dict[str, float]: ...


class HiddenMatrices(NamedTuple):
    """muP's "hidden" weights: matrices whose fan-in and fan-out both grow with the model's width."""

    width_multiplier: float
    """The model's width over model.mup_base_width (1.0 with muP off)."""
    params: list[torch.nn.Parameter]
    """The hidden matrices themselves; empty with muP off."""


@runtime_checkable
class HasMuP(Protocol):
    def mup_hidden_matrices(self) -> HiddenMatrices: ...


ForwardLoss = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(inputs, targets) -> (task loss, training loss): one microbatch's forward and loss; the training loss adds
the model's auxiliary losses (MoE balancing) to the task loss, and is what the backward runs on."""


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats; logits are upcast so bf16 autocast keeps an fp32 loss.
    Any leading shape works: a decoder's (batch, seq, vocab) against (batch, seq), a classifier's
    (batch, classes) against (batch,)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def full(value: torch.Tensor) -> torch.Tensor:
    """A plain tensor of `value`: a sharded one (a DTensor: a loss computed under loss_parallel is one) is
    gathered whole. Read by its method, so that the model layer needs no torch.distributed."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def model_loss(model: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = causal_lm_loss) -> ForwardLoss:
    """The ForwardLoss of `model` and `loss_fn`: a model with auxiliary_loss() has it added after the forward.
    trainer.compile on one process compiles this whole function."""

    def forward_loss(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        task_loss = loss_fn(model(inputs), targets)
        if not isinstance(model, HasAuxiliaryLoss):
            return task_loss, task_loss
        # full(): under tensor parallelism the task loss is a DTensor and the MoE losses plain tensors.
        return task_loss, full(task_loss) + model.auxiliary_loss()

    return forward_loss
