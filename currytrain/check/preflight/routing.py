"""Preflight probe. Mixture-of-experts routing: a model that routes tokens by a top-k over a linear layer's scores needs
a balancing signal in its training loss, or the routing collapses onto a few experts. The probe finds the routers by
watching a forward (no attribute names), then collapses them on purpose and asks whether the training loss notices."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from currytrain.check.probes import seeded
from currytrain.check.stage import Finding, Status, fmt
from currytrain.components import Components
from currytrain.trainer.step import Batch

TOPK = {torch.topk, torch.Tensor.topk}


@dataclass
class Routers:
    """What a forward showed: each linear layer whose outputs (through elementwise steps: a cast, a softmax, a bias)
    were ranked by a top-k over their last dimension, with the experts E and the k it kept."""

    found: dict[nn.Linear, tuple[int, int]] = field(default_factory=dict)


class _Trace(TorchFunctionMode):
    """Marks the outputs of the watched linear layers, carries a mark through any op whose result keeps the marked
    tensor's last dimension (E), and records the marked tensors a top-k ranks."""

    def __init__(self, marks: dict[int, tuple[torch.Tensor, nn.Linear]], routers: Routers):
        super().__init__()
        self.marks, self.routers = marks, routers

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        sources = [self.marks[id(a)][1] for a in _tensors(args, kwargs) if id(a) in self.marks and self.marks[id(a)][0] is a]
        if not sources:
            return out
        experts = sources[0].out_features
        if func in TOPK:
            k = kwargs.get("k", args[1] if len(args) > 1 else None)
            if isinstance(k, int) and 0 < k < experts:
                self.routers.found[sources[0]] = (experts, k)
        elif isinstance(out, torch.Tensor) and out.dim() and out.shape[-1] == experts:
            self.marks[id(out)] = (out, sources[0])
        return out


def _tensors(args, kwargs) -> list[torch.Tensor]:
    flat = list(args) + list(kwargs.values())
    return [a for a in flat if isinstance(a, torch.Tensor)] + [t for a in flat if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]


@torch.no_grad()
def find_routers(model: nn.Module, inputs: torch.Tensor) -> Routers:
    """The linear layers whose scores a top-k ranks during one forward (a linear layer of E > 1 outputs whose result,
    through steps that keep E as the last dimension, reaches a top-k keeping k < E)."""
    routers = Routers()
    marks: dict[int, tuple[torch.Tensor, nn.Linear]] = {}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features > 1]
    handles = [m.register_forward_hook(lambda module, args, out: marks.__setitem__(id(out), (out, module))) for m in linears]
    try:
        with _Trace(marks, routers):
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return routers


@contextlib.contextmanager
def collapsed(routers: Routers, boost: float = 10.0) -> Iterator[None]:
    """Every router's scores with `boost` added to its first expert: every token picks expert 0 (and k - 1 others)."""

    def lift(module, args, out):
        out = out.clone()
        out[..., 0] += boost
        return out

    handles = [router.register_forward_hook(lift) for router in routers.found]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def balancing_term(parts: Components, batch: Batch) -> float:
    """The auxiliary losses the trainer adds to the task loss (the model's auxiliary_loss()), of one train-mode forward
    on a seeded RNG; 0 for a model without them."""
    dtype = parts.autocast_dtype
    with seeded(parts, 0), torch.autocast(parts.state.device.type, dtype=dtype, enabled=dtype is not None):
        _, auxiliary = parts.forward_loss(*batch)
    return float(auxiliary) if auxiliary is not None else 0.0


def routing_balance(parts: Components, batch: Batch, response: float = 0.5) -> Finding:
    """A model that routes by top-k needs a balancing term in its training loss (the auxiliary loss the trainer adds to
    the task loss), and that term must grow when the routing collapses. Routing every token to expert 0 makes a
    Switch-style balancing loss grow from about 1 to E / k times its balanced value; a term that grows by less than
    `response` of that growth barely sees the collapse (a softmax applied to probabilities flattens it); none at all
    leaves nothing to stop the collapse."""
    name = "routing balance"
    expected = f"a balancing term in the training loss that grows by >= {response:.0%} of E/k - 1 when every token picks one expert"
    modes = {module: module.training for module in parts.model.modules()}
    try:
        parts.model.train()
        routers = find_routers(parts.model, batch[0])
        if not routers.found:
            return Finding(name, Status.SKIPPED, "no top-k routing in the forward", expected)
        experts, k = next(iter(routers.found.values()))
        natural = balancing_term(parts, batch)
        with collapsed(routers):
            collapse = balancing_term(parts, batch)
    finally:
        for module, training in modes.items():
            module.training = training
    count = len(routers.found)
    observed = f"{count} routers (top-{k} of {experts}); balancing term {fmt(natural)} as built, {fmt(collapse)} with every token on expert 0"
    if abs(natural) < 1e-12 and abs(collapse) < 1e-12:
        return Finding(
            name,
            Status.WARNING,
            observed,
            expected,
            "the training loss holds no balancing term: the model routes tokens by top-k, and nothing in the loss it trains on pushes "
            "the routing back toward balance (a load-balancing loss computed but never added), so the experts can collapse onto a few",
            "return the routers' load-balancing loss from the model's auxiliary_loss() (the trainer adds it), or balance without a loss "
            "(an expert bias updated once per step)",
        )
    ideal = experts / k - 1
    growth = collapse / natural - 1 if natural > 0 else float("inf")
    if growth >= response * ideal:
        return Finding(name, Status.PASSED, observed + f" (x{collapse / natural:.2f}; E/k = {experts / k:.2g})" if natural > 0 else observed, expected)
    return Finding(
        name,
        Status.WARNING,
        observed + f" (x{collapse / natural:.2f}; a Switch-style loss grows x{experts / k:.2g})",
        expected,
        "the balancing term barely responds when every token is routed to one expert: it is computed on flattened scores (a softmax "
        "applied to probabilities that already went through one), so it cannot pull the routing back",
        "compute the balancing loss from the router's probabilities over all experts, softmax applied once",
    )
