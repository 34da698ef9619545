"""Pieces the stages share: a batch, the loss a training step computes, one training step, and a scratch
context that puts the model and optimizer back as they were after a probe trained them."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator

import torch

from currytrain.components import Components
from currytrain.model.protocol import HasAuxiliaryLoss, causal_lm_loss
from currytrain.trainer.step import Batch, StepResult, run_accumulated_step

StepFn = Callable[[Components, Batch], StepResult]
"""One training step of `parts` on one batch: what the probes train with (tests pass broken ones)."""


def train_step(parts: Components, batch: Batch) -> StepResult:
    """The trainer's own step (forward, backward, clip, finiteness check, optimizer step, zero_grad)."""
    clip = parts.cfg.trainer.grad_clip
    return run_accumulated_step(parts.model, parts.optimizer, [batch], loss_fn=causal_lm_loss, grad_clip=clip, autocast_dtype=parts.autocast_dtype)


def get_batch(parts: Components, batch_size: int, split: str = "train", step: int = 0) -> Batch:
    inputs, targets = parts.data.batch(split, step, 0, batch_size, rank=parts.state.dp_rank)
    return inputs.to(parts.state.device), targets.to(parts.state.device)


def loss_of(parts: Components, batch: Batch, *, with_aux: bool = True) -> torch.Tensor:
    """The loss a training step backpropagates: the task loss plus the model's auxiliary loss (MoE)."""
    inputs, targets = batch
    dtype = parts.autocast_dtype
    with torch.autocast(parts.state.device.type, dtype=dtype, enabled=dtype is not None):
        loss = causal_lm_loss(parts.model(inputs), targets)
        if with_aux and isinstance(parts.model, HasAuxiliaryLoss):
            loss = loss + parts.model.auxiliary_loss()
    return loss


@torch.no_grad()
def eval_loss(parts: Components, batch: Batch) -> float:
    """The task loss in eval mode, the model's mode restored afterwards."""
    with eval_mode(parts.model):
        return float(loss_of(parts, batch, with_aux=False))


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """model.eval() for the block, then every module's own mode back (a probe must not fix a mode bug)."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, training in modes.items():
            module.training = training


@contextlib.contextmanager
def scratch(parts: Components, lr: str | float | None = None) -> Iterator[None]:
    """Train freely inside the block; the weights, optimizer state and learning rates are restored after.

    lr: None keeps the scheduled lr of step 0, "peak" sets every group to the lr the schedule peaks at,
    a number sets every group to it.
    """
    weights = copy.deepcopy(parts.model.state_dict())
    optimizer_state = copy.deepcopy(parts.optimizer.state_dict())
    lrs = [group["lr"] for group in parts.optimizer.param_groups]
    for group in parts.optimizer.param_groups:
        if lr == "peak":
            group["lr"] = group.get("initial_lr", group["lr"])
        elif lr is not None:
            group["lr"] = float(lr)
    try:
        yield
    finally:
        parts.model.load_state_dict(weights)
        parts.optimizer.load_state_dict(optimizer_state)
        for group, value in zip(parts.optimizer.param_groups, lrs):
            group["lr"] = value
        parts.optimizer.zero_grad(set_to_none=True)


def peak_lr(parts: Components) -> float:
    group = parts.optimizer.param_groups[0]
    return float(group.get("initial_lr", group["lr"]))


def output_size(parts: Components, batch: Batch) -> int:
    """C, the number of classes the model predicts over (its logits' last dimension)."""
    with torch.no_grad(), eval_mode(parts.model):
        return int(parts.model(batch[0][:1]).shape[-1])


def expected_shapes(parts: Components, batch_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(inputs, targets) shapes a batch of `batch_size` sequences should have: the adapter's own
    `expected_shapes(batch_size)` when it defines one (a classifier: targets (batch, 1)), else a language
    model's, (batch, seq_len) for both."""
    if hasattr(parts.data, "expected_shapes"):
        inputs, targets = parts.data.expected_shapes(batch_size)
        return tuple(inputs), tuple(targets)
    return (batch_size, parts.data.seq_len), (batch_size, parts.data.seq_len)


def num_classes(parts: Components) -> int:
    """C, the classes the targets index: the adapter's `num_classes` when it has one, else model.vocab_size."""
    return int(getattr(parts.data, "num_classes", None) or parts.cfg.model.vocab_size)


def next_token_task(batch: Batch) -> bool:
    """Targets per input position (a language model); a classifier's (batch, 1) labels are not."""
    return batch[0].shape == batch[1].shape


def chance_loss(num_classes: int) -> float:
    """-log(1/C): the loss of a uniform prediction over C classes."""
    return math.log(num_classes)
