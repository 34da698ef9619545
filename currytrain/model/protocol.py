"""The model protocol: what the trainer, every ladder stage and `currytrain bench` ask of a model, and what they
fall back to when it offers nothing more than a forward.

A model is any `nn.Module` whose forward maps a batch's inputs to logits (class scores on the last dimension).
That is all it must provide; a plain module written without curryTrain's layers or attribute names trains and
climbs the ladder as it is. It may also offer the optional methods below, each found by its type (a
runtime-checkable Protocol of one method), never by an attribute name or a config field:

- loss(logits, batch): its own task loss of one microbatch; `batch` is the (inputs, targets) pair, so masks and
  ignore indices are the model's. A second parameter named `targets` or `labels` gets the targets alone. It says
  what it scored in one of three forms (as_loss_sum): a (sum, count) pair (the summed loss of the targets it
  scored and their number; LossSum), per-target losses with a mask (a (losses, mask) pair, or the losses alone
  when every one counts), or a scalar mean over the targets that are not the data adapter's `ignore_index` (a
  class attribute `loss_reduction = "sum"` makes that scalar their sum instead). Without it: the cross-entropy of
  the logits' last dimension against the targets, ignoring the data adapter's `ignore_index` (-100 when it declares
  none). A data adapter may have a loss() of the same form, which comes first: the task then says what is scored
  (data=probe scores its answers alone). However a loss says it, a step's loss is the sum over every scored target
  of all its microbatches and data-parallel ranks divided by their number (docs/training.md, "How the loss is
  normalized").
- param_groups() -> parameters or parameter groups: what its optimizer trains. Plain parameters get the
  optimizer's usual split (matrices decayed, 1-D parameters not); dicts are torch parameter groups, whose
  optional `lr_scale` multiplies the configured lr (so lr sweeps keep the ratios) and whose `lr` or
  `weight_decay` replace the configured ones. Without it: every trainable parameter, split as above.
- repeated_blocks() -> sequence of modules: the blocks whose statistics the ladder compares with depth. Without
  it they are found in the module tree (find_blocks: the same-class siblings holding the most parameters).
- auxiliary_loss() -> Tensor: extra losses of the last forward (MoE balancing), added before backward;
- training_metrics() -> dict[str, float]: statistics of the last forward, logged with the train metrics;
- mup_hidden_matrices() -> HiddenMatrices: the weights muP trains with a width-scaled learning rate;
- decode(tokens, cache) -> Tensor: generation's cached forward (HasKVCache): the logits of the new tokens, which
  follow the positions the KVCache (model/cache.py) holds and are added to it. Without it, generation runs the
  whole sequence through forward for every new token;
- use_document_boundaries(boundary, restart_positions, masked): respect the documents of packed windows (each
  ended by the token `boundary`): positions restart at each document, and with masked attention stays inside
  it. Asked for when the data adapter's `document_boundaries` is set (data.restart_positions, data.mask_documents).

Sizes (classes, sequence length, vocabulary) come from the data adapter (`num_classes`, `seq_len`,
`vocab_size`, `ignore_index`) or are read off the model's outputs, never from config field names.

This module imports torch but not torch.distributed: a model knows nothing of how it is parallelized.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
from torch import nn

from currytrain.errors import ConfigError
from currytrain.model.cache import KVCache
from currytrain.model.loss import cross_entropy

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
"""The target the default loss ignores when the data adapter declares no `ignore_index` (torch's own default)."""

Batch = tuple[torch.Tensor, torch.Tensor]
"""(inputs, targets) of one microbatch."""

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(logits, targets) -> the task loss summed over the targets it scores: the step's default loss (token_loss_sum),
and what pipeline parallelism calls on its last stage."""


class LossSum(NamedTuple):
    """One microbatch's task loss as a step reduces it: the summed loss of the targets it scored and their number.
    A step divides the sum of every microbatch's and rank's `total` by the sum of their `count`."""

    total: torch.Tensor
    """The loss summed over the scored targets (nats; a DTensor under loss_parallel)."""
    count: torch.Tensor | int
    """How many targets were scored."""
    counted_as_step: bool = False
    """The count is, by construction, the one a step makes itself (the targets that are not ignore_index): the step
    need not compare them. False for a loss() that counted its own targets."""

    @property
    def mean(self) -> torch.Tensor:
        """The loss per scored target: what one microbatch alone reports."""
        return self.total / self.count


TaskLoss = Callable[[torch.Tensor, Batch], LossSum]
"""(logits, (inputs, targets)) -> the task loss: the data adapter's or the model's own loss() when there is one,
else a LossFn, as a LossSum."""


@runtime_checkable
class HasLoss(Protocol):
    def loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor: ...


@runtime_checkable
class HasParamGroups(Protocol):
    def param_groups(self) -> Iterable[nn.Parameter] | Iterable[dict[str, Any]]: ...


@runtime_checkable
class HasRepeatedBlocks(Protocol):
    def repeated_blocks(self) -> Sequence[nn.Module]: ...


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


@runtime_checkable
class HasKVCache(Protocol):
    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor: ...


@runtime_checkable
class HasDocumentBoundaries(Protocol):
    def use_document_boundaries(self, boundary: int, restart_positions: bool, masked: bool) -> None: ...


HOOKS = {
    HasLoss: "loss",
    HasParamGroups: "param_groups",
    HasRepeatedBlocks: "repeated_blocks",
    HasAuxiliaryLoss: "auxiliary_loss",
    HasTrainingMetrics: "training_metrics",
    HasMuP: "mup_hidden_matrices",
    HasKVCache: "decode",
    HasDocumentBoundaries: "use_document_boundaries",
}
"""The optional hooks of this protocol that are looked up as bound methods (see hook())."""

ForwardLoss = Callable[[torch.Tensor, torch.Tensor], tuple[LossSum, torch.Tensor | None]]
"""(inputs, targets) -> (task loss, auxiliary loss): one microbatch's forward and loss. The auxiliary loss is the
model's auxiliary_loss() (MoE balancing, a mean over the microbatch's own tokens) or None."""


def hook(model: nn.Module, protocol: type) -> Callable | None:
    """The model's method of `protocol` (one of the Has* protocols above), or None. A module stored under the
    method's name (self.loss = nn.CrossEntropyLoss()) is a part of the model, not the hook."""
    if not isinstance(model, protocol):
        return None
    method = getattr(model, HOOKS[protocol])
    return method if inspect.ismethod(method) else None


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Mean cross-entropy in nats over the targets that are not `ignore_index`; logits are upcast so bf16
    autocast keeps an fp32 loss. Any leading shape works: a decoder's (batch, seq, vocab) against (batch, seq),
    a classifier's (batch, classes) against (batch,). Large bf16 or fp32 logits on the CPU take a chunked kernel
    with the same loss and gradient (currytrain/model/loss.py)."""
    return cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index)


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """causal_lm_loss summed over the scored targets instead of averaged: the step's default loss (a step divides
    the sum over all its microbatches and ranks by their number of scored targets)."""
    return cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index, reduction="sum")


def scored_count(targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor | int:
    """How many of `targets` a loss scores: the class indices that are not `ignore_index` (a tensor); targets that
    are not indices (regression values, soft labels) count one per row (an int: no tensor made on the device)."""
    if targets.is_floating_point():
        return targets.shape[0] if targets.dim() else 1
    if targets.dtype == torch.uint8:  # bytes: compared as integers, as the cross-entropy reads them (not -100 as 156)
        targets = targets.long()
    return (targets != ignore_index).sum()


def data_ignore_index(data: Any) -> int:
    """The target the data adapter marks as "not scored" (its `ignore_index`), -100 when it declares none."""
    value = getattr(data, "ignore_index", None)
    return IGNORE_INDEX if value is None else int(value)


def default_loss(ignore_index: int = IGNORE_INDEX) -> LossFn:
    """token_loss_sum ignoring `ignore_index` (the function itself for the default, so compiled graphs match)."""
    return token_loss_sum if ignore_index == IGNORE_INDEX else functools.partial(token_loss_sum, ignore_index=ignore_index)


def own_loss(model: nn.Module, data: Any = None) -> Callable | None:
    """The loss() that scores the task, as task_loss finds it: the data adapter's, else the model's, else None."""
    own = hook(data, HasLoss) if data is not None else None
    return own or hook(model, HasLoss)


def task_loss(model: nn.Module, loss_fn: LossFn = token_loss_sum, data: Any = None) -> TaskLoss:
    """The task loss of `model` on `data` as a LossSum: the data adapter's loss(logits, batch) when it has one (a task
    that says what is scored: data=probe scores the answers alone), else the model's own, else loss_fn(logits,
    targets) over the targets that are not the adapter's ignore_index."""
    ignore_index = data_ignore_index(data)
    own = own_loss(model, data)
    if own is None:
        return lambda logits, batch: LossSum(loss_fn(logits, batch[1]), scored_count(batch[1], ignore_index), True)
    owner = own.__self__
    reads = (lambda batch: batch[1]) if wants_targets(own) else (lambda batch: batch)
    reduction = getattr(owner, "loss_reduction", "mean")
    if reduction not in ("mean", "sum"):
        raise TypeError(f"{type(owner).__name__}.loss_reduction={reduction!r}: declare 'mean' or 'sum' (or return (sum, count) from loss())")

    def reduce(logits: torch.Tensor, batch: Batch) -> LossSum:
        value = own(logits, reads(batch))
        # is_compiling() first: a compiled forward never reads (or guards on) what was said
        if not torch.compiler.is_compiling() and isinstance(value, torch.Tensor) and value.dim() == 0:
            _warn_scalar_loss(owner, batch[1])
        return as_loss_sum(value, batch[1], ignore_index, summed=reduction == "sum")

    return reduce


def as_loss_sum(value: Any, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX, summed: bool = False) -> LossSum:
    """A loss() result as a LossSum, by its form (see the module docstring): a (sum, count) pair, (per-target losses,
    mask), per-target losses that all count, or a scalar mean (a sum when `summed`) over the scored targets."""
    forms = "return (sum, count), (per-target losses, mask of their shape) or one tensor"
    if isinstance(value, tuple | list):
        if len(value) != 2:
            raise TypeError(f"a loss() returned a tuple of {len(value)}: {forms}")
        first, second = value
        if isinstance(first, torch.Tensor) and first.dim() > 0:  # per-target losses and their mask
            if not isinstance(second, torch.Tensor) or second.shape != first.shape:
                raise TypeError(f"a loss() returned per-target losses of shape {tuple(first.shape)} with {_shape(second)} as their mask: {forms}")
            return LossSum((first * second.to(first.dtype)).sum(), second.sum())
        if isinstance(second, torch.Tensor) and second.dim() > 0:
            raise TypeError(f"a loss() returned a sum with a count of shape {tuple(second.shape)}: {forms}")
        return LossSum(first, second)
    if value.dim() > 0:
        return LossSum(value.sum(), value.numel())
    count = scored_count(targets, ignore_index)
    if summed:
        return LossSum(value, count, True)
    # a microbatch that scores nothing has a NaN mean (0/0): it adds nothing, not NaN
    mean = torch.where(count > 0, value, 0.0) if isinstance(count, torch.Tensor) else value
    return LossSum(mean * count, count, True)


def _shape(value: Any) -> str:
    return f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__


def _warn_scalar_loss(owner: Any, targets: torch.Tensor) -> None:
    """Said once per process and class where a step cannot count what a loss() that returns one number scored:
    targets that are not class indices (regression values, soft labels), which count one per row. Class indices
    count as the ones that are not ignore_index; a loss with a mask of its own is check=preflight's to find (the
    "loss normalization" probe)."""
    kind = type(owner)
    if kind in _WARNED or not targets.is_floating_point():
        return
    _WARNED.add(kind)
    log.warning(
        "%s.loss() returns one number on targets that are not class indices: a step weighs each microbatch by its rows (%d here). "
        'If it averages over anything else, return (sum, count) or (per-row losses, mask) instead (docs/model.md, "The model\'s own loss")',
        kind.__name__,
        targets.shape[0] if targets.dim() else 1,
    )


_WARNED: set[type] = set()


def wants_targets(method: Callable) -> bool:
    """loss(logits, targets) rather than loss(logits, batch): told by the name of its second parameter."""
    params = [p for p in inspect.signature(method).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(params) >= 2 and params[1].name in ("targets", "target", "labels", "label", "y")


def full(value: torch.Tensor) -> torch.Tensor:
    """A plain tensor of `value`: a sharded one (a DTensor: a loss computed under loss_parallel is one) is
    gathered whole. Read by its method, so that the model layer needs no torch.distributed."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def model_loss(model: nn.Module, loss_fn: LossFn = token_loss_sum, data: Any = None) -> ForwardLoss:
    """The ForwardLoss of `model`: its task loss (task_loss: the data's or its own, else `loss_fn`) and its
    auxiliary_loss() when it has one. trainer.compile on one process compiles this whole function."""
    loss_of = task_loss(model, loss_fn, data)
    auxiliary = isinstance(model, HasAuxiliaryLoss)  # asked once: a runtime protocol check costs microseconds a step

    def forward_loss(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[LossSum, torch.Tensor | None]:
        task = loss_of(model(inputs), (inputs, targets))
        return task, model.auxiliary_loss() if auxiliary else None

    return forward_loss


def apply_document_boundaries(model: nn.Module, data: Any) -> None:
    """Tell `model` the documents of the data's windows, when the adapter asks (its `document_boundaries`:
    (boundary token, restart positions, masked), else None); a ConfigError when the model cannot respect them."""
    wanted = getattr(data, "document_boundaries", None)
    if wanted is None:
        return
    method = hook(model, HasDocumentBoundaries)
    if method is None:
        raise ConfigError(
            f"data.restart_positions / data.mask_documents: {type(model).__name__} has no use_document_boundaries(), so it cannot restart "
            "positions or mask attention at documents: pass model=gqa or model=moe, or set both to false"
        )
    method(*wanted)


def optimizer_groups(model: nn.Module, weight_decay: float, lr: float) -> list[dict[str, Any]] | None:
    """The model's own parameter groups (param_groups()) as torch groups, or None when it declares none.

    Plain parameters are split as the default groups are (matrices decayed, 1-D parameters not); a dict's
    `lr_scale` becomes lr * lr_scale; groups keep every other key (torch fills lr and weight_decay from the
    optimizer's defaults where a group has none)."""
    own = hook(model, HasParamGroups)
    if own is None:
        return None
    groups, loose = [], []
    for item in own():
        if isinstance(item, dict):
            group = dict(item)
            group["params"] = [p for p in group["params"]]
            scale = group.pop("lr_scale", None)
            if scale is not None:
                group["lr"] = lr * float(scale)
            groups.append(group)
        else:
            loose.append(item)
    if loose:
        groups = [
            {"params": [p for p in loose if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in loose if p.dim() < 2], "weight_decay": 0.0},
            *groups,
        ]
    return [group for group in groups if group["params"]]


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks, with their qualified names: repeated_blocks() when it declares them, else
    the largest (by parameters) set of same-class siblings that hold parameters, at least two of them or the
    contents of an nn.ModuleList/nn.Sequential (a one-block stack); composite modules win over single layers
    (a token and a position embedding are no stack). [] when there is no such set."""
    names = {id(module): name for name, module in model.named_modules()}
    own = hook(model, HasRepeatedBlocks)
    if own is not None:
        return [(names.get(id(block), f"block{index}"), block) for index, block in enumerate(own())]
    best: list[tuple[str, nn.Module]] = []
    best_rank = (False, 0)
    for parent_name, parent in model.named_modules():
        container = isinstance(parent, (nn.ModuleList, nn.Sequential))
        by_class: dict[type, list[tuple[str, nn.Module]]] = {}
        for child_name, child in parent.named_children():
            by_class.setdefault(type(child), []).append((f"{parent_name}.{child_name}" if parent_name else child_name, child))
        for members in by_class.values():
            if len(members) < 2 and not (container and len(by_class) == 1):
                continue
            size = sum(p.numel() for _, child in members for p in child.parameters())
            # Blocks are composite: two embeddings (tokens, positions) are larger than small blocks, yet no stack.
            rank = (any(True for _ in members[0][1].children()), size)
            if size and rank > best_rank:
                best, best_rank = members, rank
    return best
