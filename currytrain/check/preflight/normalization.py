"""Preflight probe. The loss rule on the user's own model and data: the gradient of one batch equals the gradient of
the same batch taken as microbatches of different sizes and, in a data-parallel run, shared out over the ranks
(docs/training.md, "How the loss is normalized"). A loss that reduces wrongly (a mean over a mask of its own,
returned as one number) passes on one microbatch and trains on the wrong objective once a step is split."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from currytrain.check.probes import eval_mode
from currytrain.check.stage import Finding, Status
from currytrain.components import Components
from currytrain.model.protocol import model_loss, own_loss, wants_targets
from currytrain.trainer.step import Batch, backward_microbatches

NAME = "loss normalization"


def loss_normalization(parts: Components, batch_size: int, fail: float = 1e-2, warn: float = 1e-3) -> Finding:
    """The step's gradient of `batch_size` sequences per rank at once against the same sequences as the ranks'
    shares, each cut into microbatches of 1 and the rest, in eval mode (no dropout): only the loss's reduction and
    rounding can differ. Rounding is measured (the same batch with its rows in another order) and the thresholds
    kept above it, so bf16 parameters raise no alarm. Rows whose outputs depend on the rest of their batch make the
    comparison meaningless: said, not failed."""
    state = parts.state
    dims = state.dims
    ranks, rank = state.dp_size, state.dp_rank
    expected = (
        f"the same gradient for a batch at once and as microbatches of unequal sizes{' over the ranks' if ranks > 1 else ''} (relative difference < {warn:g})"
    )
    if parts.pipeline is not None or (dims is not None and (dims.cp > 1 or dims.tp > 1)):
        return Finding(NAME, Status.SKIPPED, "pipeline, context or tensor parallelism: the step's layout is the trainer's own", expected)
    if batch_size < 2:
        return Finding(NAME, Status.SKIPPED, f"check.stages.preflight.batch_size={batch_size}: one sequence per rank, nothing to split", expected)
    whole = parts.data.batch("train", 0, 0, batch_size * ranks)  # the same sequences on every rank
    if not _same_on_every_rank(whole, state):
        return Finding(NAME, Status.SKIPPED, "the data adapter gives the ranks different batches for the same arguments", expected)
    share = _rows(whole, rank * batch_size, batch_size)
    split = [_rows(share, 0, 1), _rows(share, 1, batch_size - 1)]
    reordered = (whole[0].flip(0), whole[1].flip(0))
    with eval_mode(parts.model):
        coupling, rounding = _row_coupling(parts, share, split)
        if coupling > max(warn, 10 * rounding):
            observed = f"the outputs of a sequence change by {coupling:.2g} (relative) with the rest of its batch"
            return Finding(NAME, Status.SKIPPED, observed + ": the split gradient cannot be compared (batch norm, capacity routing)", expected)
        at_once = _gradient(parts, [whole])
        floor = _relative(_gradient(parts, [reordered]), at_once, state)
        apart = _gradient(parts, split)
    difference = _relative(apart, at_once, state)
    observed = f"relative difference {difference:.2g} between {batch_size * ranks} sequences at once and as {len(split)} microbatches" + (
        f" on each of {ranks} ranks" if ranks > 1 else ""
    )
    observed += f" (rounding: {floor:.2g})"
    if difference <= max(warn, 3 * floor):
        return Finding(NAME, Status.PASSED, observed, expected)
    cause, fix = _cause(parts, whole)
    return Finding(NAME, Status.FAILED if difference > max(fail, 10 * floor) else Status.WARNING, observed, expected, cause, fix)


def _rows(batch: Batch, start: int, count: int) -> Batch:
    return batch[0][start : start + count], batch[1][start : start + count]


def _same_on_every_rank(batch: Batch, state) -> bool:
    """Whether every rank drew the same batch (a checksum's largest and smallest over the ranks agree)."""
    if state.mesh is None:
        return True
    checksum = float(batch[0].double().sum() + 3 * batch[1].double().sum())
    bounds = torch.tensor([checksum, -checksum], dtype=torch.float64, device=state.device)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    return bool(bounds[0] == -bounds[1])


def _row_coupling(parts: Components, share: Batch, split: list[Batch]) -> tuple[float, float]:
    """How far the logits of this rank's sequences move when they are computed in microbatches instead of together,
    and how far they move with the rows in reverse order (the rounding of another batch shape, not a coupling)."""
    device = parts.state.device
    inputs = share[0].to(device)
    with torch.no_grad():
        together = parts.model(inputs).float()
        apart = torch.cat([parts.model(part.to(device)).float() for part, _ in split])
        reversed_rows = parts.model(inputs.flip(0)).float().flip(0)
    scale = together.norm().clamp(min=1e-12)
    return float((together - apart).norm() / scale), float((together - reversed_rows).norm() / scale)


def _gradient(parts: Components, microbatches: list[Batch]) -> list[torch.Tensor]:
    """This rank's gradients after the step's backward of `microbatches`, the task loss alone (no auxiliary loss)."""
    forward = model_loss(parts.model, parts.loss_fn, parts.data)
    params = [p for p in parts.model.parameters() if p.requires_grad]
    parts.optimizer.zero_grad(set_to_none=True)
    parts.model.zero_grad(set_to_none=True)
    backward_microbatches(
        microbatches,
        lambda inputs, targets: (forward(inputs, targets)[0], None),
        parts.normalization,
        parts.state.device,
        loss_context=parts.state.loss_context,
        parameters=params,
    )
    grads = [_local(p.grad).detach().clone() if p.grad is not None else torch.zeros_like(_local(p)) for p in params]
    parts.optimizer.zero_grad(set_to_none=True)
    parts.model.zero_grad(set_to_none=True)
    return grads


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _relative(got: list[torch.Tensor], want: list[torch.Tensor], state) -> float:
    """||got - want|| / ||want|| over every rank's gradients (sharded ones summed over their shards)."""
    squares = torch.stack([sum(((g - w).double() ** 2).sum() for g, w in zip(got, want)), sum((w.double() ** 2).sum() for w in want)])
    if state.mesh is not None:
        dist.all_reduce(squares)
    return float(squares[0].sqrt() / squares[1].sqrt().clamp(min=1e-30))


def _cause(parts: Components, batch: Batch) -> tuple[str, str]:
    own = own_loss(parts.module, parts.data)
    if own is None:
        return (
            "the default loss weighs microbatches or ranks unequally: a bug in curryTrain's step (currytrain/trainer/step.py)",
            "report it with this run's resolved.yaml",
        )
    owner = type(own.__self__).__name__
    device = parts.state.device
    inputs, targets = batch[0].to(device), batch[1].to(device)
    with torch.no_grad(), eval_mode(parts.model):
        returned = own(parts.model(inputs), targets if wants_targets(own) else (inputs, targets))
    if isinstance(returned, torch.Tensor) and returned.dim() == 0:
        ignore = parts.normalization.ignore_index
        return (
            f"{owner}.loss() returns one number per microbatch, a mean over targets it chose itself (a mask the data does not mark with "
            f"ignore_index={ignore}), so each microbatch and rank is weighted by the {int(parts.normalization.count(targets))} targets "
            "the step counts instead of its own: split over microbatches or ranks, a step trains on another objective",
            f'return (sum, count) or (per-target losses, mask) from {owner}.loss() (docs/model.md, "The model\'s own loss"), or mark the '
            "targets it does not score with the data adapter's ignore_index",
        )
    return (
        f"{owner}.loss() says it scored other targets than the ones it summed, or its sum depends on how the batch is cut",
        f"make {owner}.loss() return the sum of its scored targets' losses and their number (docs/model.md, \"The model's own loss\")",
    )
