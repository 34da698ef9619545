"""Pieces the stages share: a batch, the loss a training step computes, one training step, and a scratch
context that puts the model and optimizer back as they were after a probe trained them. The loss is the
run's (Components: the model's own loss() when it has one), and the sizes a probe needs (classes, input
vocabulary, sequence length) come from the data adapter or the model's outputs, never from config field
names (currytrain.model.protocol)."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator

import torch

from currytrain.components import Components
from currytrain.model.protocol import full
from currytrain.trainer.step import Batch, StepResult, run_accumulated_step

StepFn = Callable[[Components, Batch], StepResult]
"""One training step of `parts` on one batch: what the probes train with (tests pass broken ones)."""


def train_step(parts: Components, batch: Batch) -> StepResult:
    """The trainer's own step (forward, backward, clip, finiteness check, optimizer step, zero_grad) on the
    run's loss (the model's own when it has one)."""
    clip = parts.cfg.trainer.grad_clip
    return run_accumulated_step(
        parts.model,
        parts.optimizer,
        [batch],
        forward_loss=parts.forward_loss,
        normalization=parts.normalization,
        grad_clip=clip,
        autocast_dtype=parts.autocast_dtype,
    )


def get_batch(parts: Components, batch_size: int, split: str = "train", step: int = 0) -> Batch:
    inputs, targets = parts.data.batch(split, step, 0, batch_size, rank=parts.state.dp_rank)
    return inputs.to(parts.state.device), targets.to(parts.state.device)


def loss_of(parts: Components, batch: Batch, *, with_aux: bool = True) -> torch.Tensor:
    """The loss a training step of this one batch backpropagates (with_aux: the task loss per scored target plus the
    model's auxiliary loss), or the task loss alone: the run's own forward_loss, so the model's loss() when it has one."""
    dtype = parts.autocast_dtype
    with torch.autocast(parts.state.device.type, dtype=dtype, enabled=dtype is not None):
        task, auxiliary = parts.forward_loss(*batch)
    loss = full(task.total) / max(1, int(task.count))
    return loss + auxiliary if with_aux and auxiliary is not None else loss


@contextlib.contextmanager
def seeded(parts: Components, seed: int = 0) -> Iterator[None]:
    """The block runs on torch's RNG seeded with `seed`, the RNG state outside it untouched: two forwards in
    seeded blocks draw the same dropout masks, so a comparison sees the change it made and not the noise."""
    devices = [parts.state.device] if parts.state.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


@torch.no_grad()
def eval_loss(parts: Components, batch: Batch, seed: int = 0) -> float:
    """The task loss in eval mode on a seeded RNG (randomness left on in eval cannot make two evaluations of the
    same weights differ), the model's mode restored afterwards."""
    with eval_mode(parts.model), seeded(parts, seed):
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
def scratch(parts: Components, lr: str | float | None = None, scale: float = 1.0) -> Iterator[None]:
    """Train freely inside the block; the weights, optimizer state and learning rates are restored after.

    lr: None keeps the scheduled lr of step 0, "peak" sets every group to the lr the schedule peaks at (times
    `scale`), a number sets every group to it.
    """
    weights = copy.deepcopy(parts.model.state_dict())
    optimizer_state = copy.deepcopy(parts.optimizer.state_dict())
    lrs = [group["lr"] for group in parts.optimizer.param_groups]
    for group in parts.optimizer.param_groups:
        if lr == "peak":
            group["lr"] = group.get("initial_lr", group["lr"]) * scale
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
        parts.model.zero_grad(set_to_none=True)  # parameters outside the optimizer too


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
    """C, the classes the targets index: the adapter's `num_classes` when it has one, else the width of the
    model's logits (their last dimension)."""
    declared = getattr(parts.data, "num_classes", None)
    if declared:
        return int(declared)
    return output_size(parts, get_batch(parts, 1))


def input_vocab(parts: Components, inputs: torch.Tensor | None = None) -> int | None:
    """How many token ids the model takes: the rows of the embedding table its forward looks the input ids up
    in (found by running it), else the adapter's `vocab_size`; None when neither says (not a token model)."""
    inputs = get_batch(parts, 1)[0] if inputs is None else inputs
    seen: list[torch.nn.Embedding] = []

    def look(module, args):
        if args and isinstance(args[0], torch.Tensor) and args[0].shape == inputs.shape and torch.equal(args[0], inputs):
            seen.append(module)

    handles = [m.register_forward_pre_hook(look) for m in parts.model.modules() if isinstance(m, torch.nn.Embedding)]
    try:
        with torch.no_grad(), eval_mode(parts.model):
            parts.model(inputs)
    except Exception:  # ids outside the table raise after the hook saw them; any other error is another probe's
        pass
    finally:
        for handle in handles:
            handle.remove()
    if seen:
        return int(seen[0].num_embeddings)
    declared = getattr(parts.data, "vocab_size", None)
    return int(declared) if declared else None


def data_vocab(parts: Components) -> int | None:
    """How many token ids the data adapter yields (its `vocab_size`), else the model's input vocabulary."""
    declared = getattr(parts.data, "vocab_size", None)
    return int(declared) if declared else input_vocab(parts)


def next_token_task(batch: Batch) -> bool:
    """Targets per input position (a language model); a classifier's (batch, 1) labels are not."""
    return batch[0].shape == batch[1].shape


def chance_loss(num_classes: int) -> float:
    """-log(1/C): the loss of a uniform prediction over C classes."""
    return math.log(num_classes)


CHANCE_MARGIN = 0.05
"""Nats below chance a loss must reach to count as learned: a model whose loss stays within this of ln C has learned
nothing a uniform guess does not know, and evidence resting on it (a noise, a fit, a sweep) measures an untrained model."""


def data_chance(data) -> float | None:
    """ln C for the classes the data adapter's targets index: its `num_classes`, else its `vocab_size`; None when it
    declares neither (the model's outputs then tell, see num_classes)."""
    classes = getattr(data, "num_classes", None) or getattr(data, "vocab_size", None)
    return chance_loss(int(classes)) if classes else None


def at_chance(loss: float, chance: float | None, margin: float = CHANCE_MARGIN) -> bool:
    """Whether `loss` has not left chance (no more than `margin` below ln C; a loss that is not finite has not)."""
    return chance is not None and (not math.isfinite(loss) or loss > chance - margin)
