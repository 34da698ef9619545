"""The mixture-of-experts decoder: GQA attention blocks whose MLP is a top-k routed bank of SwiGLU experts.

Architecture only: expert parallelism, checkpointing and compile are applied from outside.

One MoE layer, for the T tokens of a forward pass:
  1. TopKRouter scores every expert per token and keeps the top_k (weights, expert ids).
  2. build_dispatch groups the T * top_k assignments by expert; with a capacity it drops the ones that
     overflow an expert's slots, first choices before second choices (GShard), earlier tokens first.
  3. GroupedExperts runs every expert on its group at once: a padded (experts, capacity, dim) batch of
     matmuls, or, dropless, one matmul per expert over its contiguous slice (model/grouped.py: one operator of
     static shape, so torch.compile sees the whole layer as one graph). No loop over tokens.
  4. The expert outputs, scaled by the router weights, are summed back into each token's row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from currytrain.model.config import MOE_GATINGS
from currytrain.model.decoder import RopeDecoder
from currytrain.model.grouped import grouped_linear
from currytrain.model.layers import ACTIVATIONS, SwiGLU


@dataclass
class Routing:
    """What the router decided for T tokens choosing top_k of E experts."""

    weights: torch.Tensor
    """(T, top_k) combine weight of each chosen expert (fp32 or wider)."""
    indices: torch.Tensor
    """(T, top_k) chosen expert ids, best first."""
    probs: torch.Tensor
    """(T, E) each token's distribution over all experts (sums to 1): what the balance loss averages."""
    logits: torch.Tensor
    """(T, E) raw router scores: what the z-loss penalises."""


def expert_counts(indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """(E,) how many of `indices` name each expert: bincount with a static shape (bincount's length depends on the
    largest index, so torch.compile cannot trace it without breaking the graph)."""
    flat = indices.flatten()
    return torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))


def load_balancing_loss(probs: torch.Tensor, indices: torch.Tensor, num_experts: int, counts: torch.Tensor | None = None) -> torch.Tensor:
    """Switch/GShard balance loss E * sum_i f_i * P_i.

    f_i is the share of the T * top_k assignments sent to expert i (counted before any dropping; not
    differentiable), P_i the mean router probability of expert i (differentiable). Normalising f by
    T * top_k rather than T makes the loss 1.0 for a perfectly balanced routing whatever top_k is, and
    larger the more the router favours the experts it already overloads.
    counts: the (E,) assignments per expert f is computed from, when not these tokens' own (data/expert
    parallelism passes the global batch's, so that the mean of every rank's loss is the global batch's loss).
    """
    if counts is None:
        counts = expert_counts(indices, num_experts)
    fraction = counts.to(probs.dtype) / counts.sum()
    return num_experts * torch.sum(fraction * probs.mean(0))


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE z-loss: mean squared logsumexp of the router logits; keeps them small, so softmax stays stable."""
    return torch.logsumexp(logits, dim=-1).square().mean()


class TopKRouter(nn.Module):
    """Scores E experts per token with one linear map and keeps the top_k.

    softmax gating: probabilities over all experts, top_k of them, optionally renormalised to sum to 1
    (with renormalize=True this is Mixtral's routing). sigmoid gating: an independent score per expert,
    top_k by score, optionally renormalised over the chosen ones (DeepSeek-V3).
    """

    def __init__(self, dim: int, num_experts: int, top_k: int, gating: str = "softmax", renormalize: bool = True):
        super().__init__()
        if gating not in MOE_GATINGS:
            raise ValueError(f"gating={gating!r} is not one of {list(MOE_GATINGS)}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k={top_k} must be in [1, num_experts={num_experts}]")
        self.num_experts = num_experts
        self.top_k = top_k
        self.gating = gating
        self.renormalize = renormalize
        self.gate = nn.Linear(dim, num_experts, bias=False)

    def score(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits, scores, probs): the gate's logits, the scores experts are chosen by, and their normalised
        probabilities (the balance loss's)."""
        logits = self.gate(x)
        # Route in fp32 at least: under bf16 autocast, near-tied scores would otherwise pick experts at random.
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if self.gating == "softmax":
            scores = probs = logits.softmax(dim=-1)
        else:
            scores = logits.sigmoid()
            probs = scores / scores.sum(dim=-1, keepdim=True)
        return logits, scores, probs

    def forward(self, x: torch.Tensor) -> Routing:
        logits, scores, probs = self.score(x)
        weights, indices = scores.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return Routing(weights=weights, indices=indices, probs=probs, logits=logits)


class CorrectedTopKRouter(TopKRouter):
    """A TopKRouter that chooses experts by other scores than it weights them with (DeepSeek-V3):

    - bias: a per-expert `expert_bias` (a buffer, loaded with the weights, not trained by gradient) is added to
      the scores that choose the top_k, not to those that weight them (auxiliary-loss-free balancing);
    - groups > 1: the experts form equal groups; each token keeps the group_top_k groups whose two best choice
      scores sum highest and chooses among their experts only;
    - scale: the combine weights are multiplied by it after renormalising (routed_scaling_factor).
    """

    def __init__(
        self,
        dim: int,
        num_experts: int,
        top_k: int,
        gating: str = "softmax",
        renormalize: bool = True,
        *,
        bias: bool,
        groups: int,
        group_top_k: int,
        scale: float,
    ):
        super().__init__(dim, num_experts, top_k, gating, renormalize)
        if num_experts % groups or (groups > 1 and not 1 <= group_top_k <= groups):
            raise ValueError(f"router groups={groups}, group_top_k={group_top_k}: groups must divide num_experts={num_experts}, 1 <= group_top_k <= groups")
        self.groups, self.group_top_k, self.scale = groups, group_top_k, scale
        self.register_buffer("expert_bias", torch.zeros(num_experts) if bias else None)

    def forward(self, x: torch.Tensor) -> Routing:
        logits, scores, probs = self.score(x)
        choice = scores if self.expert_bias is None else scores + self.expert_bias
        if self.groups > 1:
            grouped = choice.view(-1, self.groups, self.num_experts // self.groups)
            kept = grouped.topk(2, dim=-1).values.sum(-1).topk(self.group_top_k, dim=-1).indices
            allowed = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, kept, True)
            choice = grouped.masked_fill(~allowed[..., None], float("-inf")).view_as(choice)
        indices = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(-1, indices)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return Routing(weights=weights * self.scale, indices=indices, probs=probs, logits=logits)


@dataclass
class Dispatch:
    """The T * top_k assignments of one forward pass, grouped by expert (ascending expert id)."""

    token: torch.Tensor
    """(N,) token row of each assignment."""
    expert: torch.Tensor
    """(N,) expert id of each assignment (sorted)."""
    weight: torch.Tensor
    """(N,) combine weight; 0 for a dropped assignment."""
    counts: torch.Tensor
    """(E,) assignments routed to each expert, before dropping."""
    capacity: int | None
    """Slots per expert; None when dropless."""
    kept: torch.Tensor | None = None
    """(N,) False where the expert was full; None when dropless."""
    slot: torch.Tensor | None = None
    """(N,) row in the flattened (E * capacity) expert buffer; E * capacity (one past the end) when dropped."""

    @property
    def num_dropped(self) -> torch.Tensor:
        if self.kept is None:
            return torch.zeros((), device=self.token.device)
        return (~self.kept).sum()


def build_dispatch(indices: torch.Tensor, weights: torch.Tensor, num_experts: int, capacity: int | None) -> Dispatch:
    """Group the (T, top_k) routing by expert and, with a capacity, drop what overflows.

    Priority within an expert's queue: every token's first choice before any second choice (GShard), so a
    full expert drops a token's backup choice rather than another token's only good one; then token order.
    Works without host synchronisation, so the capacity path keeps static shapes.
    """
    num_tokens, top_k = indices.shape
    # Flatten choice-major: the k-th choices of all tokens, for k = 0, 1, ...; a stable sort by expert
    # then leaves each expert's queue in priority order.
    expert = indices.t().reshape(-1)
    token = torch.arange(num_tokens, device=indices.device).repeat(top_k)
    weight = weights.t().reshape(-1)
    order = torch.argsort(expert, stable=True)
    expert, token, weight = expert[order], token[order], weight[order]
    counts = expert_counts(expert, num_experts)
    if capacity is None:
        return Dispatch(token=token, expert=expert, weight=weight, counts=counts, capacity=None)
    queue_start = torch.cumsum(counts, dim=0) - counts
    position = torch.arange(expert.numel(), device=expert.device) - queue_start[expert]
    kept = position < capacity
    slot = torch.where(kept, expert * capacity + position, num_experts * capacity)
    return Dispatch(token=token, expert=expert, weight=weight * kept, counts=counts, capacity=capacity, kept=kept, slot=slot)


class GroupedExperts(nn.Module):
    """num_experts SwiGLU MLPs, w2(silu(w1 x) * w3 x), with weights stacked per expert.

    w1, w3: (num_experts, hidden, dim) and w2: (num_experts, dim, hidden), i.e. expert e's slices are
    nn.Linear weights, the layout the HF bridge maps.
    """

    def __init__(self, num_experts: int, dim: int, hidden: int, activation: str = "silu"):
        super().__init__()
        self.num_experts = num_experts
        self.act = ACTIVATIONS[activation]
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float | None = None) -> None:
        nn.init.normal_(self.w1, std=std)
        nn.init.normal_(self.w3, std=std)
        nn.init.normal_(self.w2, std=std if out_std is None else out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (num_experts, capacity, dim), row block e for expert e -> same shape. One batched matmul per weight."""
        hidden = self.act(torch.bmm(x, self.w1.transpose(1, 2))) * torch.bmm(x, self.w3.transpose(1, 2))
        return torch.bmm(hidden, self.w2.transpose(1, 2))

    def forward_grouped(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x: (N, dim) rows grouped by expert, counts[e] rows for expert e (an (E,) tensor) -> (N, dim). No padding.

        Each weight is one grouped_linear (a matmul per expert inside one operator of static shape), so that
        torch.compile traces the whole layer as one graph."""
        hidden = self.act(grouped_linear(x, self.w1, counts)) * grouped_linear(x, self.w3, counts)
        return grouped_linear(hidden, self.w2, counts)


@dataclass
class MoEStats:
    """Statistics of one MoE layer's last forward pass. Losses keep their graph; the rest is detached."""

    aux_loss: torch.Tensor
    z_loss: torch.Tensor
    load: torch.Tensor
    """(E,) share of the assignments routed to each expert, before dropping (sums to 1)."""
    drop_rate: torch.Tensor
    """Share of the T * top_k assignments dropped for lack of capacity."""


class MoE(nn.Module):
    """Routed experts plus an optional always-on shared expert, in place of a dense MLP: (..., dim) -> (..., dim)."""

    def __init__(
        self,
        dim: int,
        num_experts: int,
        top_k: int,
        expert_hidden: int,
        gating: str = "softmax",
        renormalize: bool = True,
        capacity_factor: float = 0.0,
        shared_hidden: int = 0,
        activation: str = "silu",
        router: dict[str, Any] | None = None,
    ):
        """router: the CorrectedTopKRouter's bias, groups, group_top_k and scale, when routing uses them."""
        super().__init__()
        if capacity_factor < 0:
            raise ValueError(f"capacity_factor={capacity_factor} must be >= 0 (0 is dropless)")
        self.num_experts = num_experts
        self.top_k = top_k
        self.capacity_factor = capacity_factor
        self.router = (
            TopKRouter(dim, num_experts, top_k, gating, renormalize)
            if not router
            else CorrectedTopKRouter(dim, num_experts, top_k, gating, renormalize, **router)
        )
        self.experts = GroupedExperts(num_experts, dim, expert_hidden, activation)
        self.shared_expert = SwiGLU(dim, shared_hidden, activation) if shared_hidden > 0 else None
        self.stats: MoEStats | None = None
        self.reduce_counts: Callable[[torch.Tensor], torch.Tensor] | None = None
        """Set from outside under data/expert parallelism: turns this rank's per-expert counts into the global
        batch's, which the balance loss and the load metrics then use."""

    def capacity(self, num_tokens: int) -> int | None:
        """Slots per expert for a forward pass over num_tokens tokens; None when dropless."""
        if self.capacity_factor == 0:
            return None
        balanced_load = num_tokens * self.top_k / self.num_experts
        # Rounding first keeps e.g. 1.1 * 110 = 121.00000000000001 from becoming 122 slots.
        return math.ceil(round(self.capacity_factor * balanced_load, 9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        num_tokens, dim = x.shape
        routing = self.router(x)
        dispatch = build_dispatch(routing.indices, routing.weights, self.num_experts, self.capacity(num_tokens))
        if dispatch.capacity is None:
            # Dropless: each expert's rows are a contiguous slice, run by one operator (no host sync in the graph).
            out = self.experts.forward_grouped(x.index_select(0, dispatch.token), dispatch.counts)
        else:
            out = self._run_padded(x, dispatch)
        contributions = out * dispatch.weight.to(out.dtype).unsqueeze(-1)
        y = torch.zeros(num_tokens, dim, dtype=out.dtype, device=x.device).index_add(0, dispatch.token, contributions)
        if self.shared_expert is not None:
            y = y + self.shared_expert(x)
        counts = dispatch.counts if self.reduce_counts is None else self.reduce_counts(dispatch.counts)
        self.stats = MoEStats(
            aux_loss=load_balancing_loss(routing.probs, routing.indices, self.num_experts, counts),
            z_loss=router_z_loss(routing.logits),
            load=(counts.float() / counts.sum()).detach(),
            drop_rate=(dispatch.num_dropped.float() / dispatch.token.numel()).detach(),
        )
        return y.to(x.dtype).view(shape)

    def residual_projections(self) -> tuple[nn.Linear, ...]:
        """The shared expert's w2 (the routed experts' w2 gets the same std from GroupedExperts.reset_parameters)."""
        return () if self.shared_expert is None else (self.shared_expert.w2,)

    def _run_padded(self, x: torch.Tensor, dispatch: Dispatch) -> torch.Tensor:
        """Fill a (E, capacity, dim) buffer, run the experts as one batch, read each assignment's row back."""
        num_tokens, dim = x.shape
        num_slots = self.num_experts * dispatch.capacity
        # Which token fills each slot: empty slots and the one-past-the-end slot of the dropped
        # assignments point at an extra zero row, so the buffer is a gather (no scatter in autograd).
        slot_token = torch.full((num_slots + 1,), num_tokens, dtype=torch.long, device=x.device)
        slot_token[dispatch.slot] = dispatch.token
        x_padded = torch.cat([x, x.new_zeros(1, dim)])
        buffer = x_padded.index_select(0, slot_token[:num_slots]).view(self.num_experts, dispatch.capacity, dim)
        out = self.experts(buffer).view(num_slots, dim)
        return torch.cat([out, out.new_zeros(1, dim)]).index_select(0, dispatch.slot)


class MoETransformer(RopeDecoder):
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab_size), each MLP a routed MoE (registered as
    `moe`), except the dense_layers, whose MLP is one gated MLP of width dense_hidden (`mlp`, as model=gqa's).

    After each forward, auxiliary_loss() holds the weighted balance and z losses (the trainer adds it
    to the task loss) and training_metrics() the per-layer expert load, drop rate and losses.

    muP (mup=true) is the Decoder's; the experts and the router count as hidden matrices (the
    router's logits then keep their base-width size at init and move by a width-independent amount).
    fields: the other RopeDecoderConfig fields (RopeDecoder's keyword arguments): attention, norms, RoPE.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        n_layers: int,
        n_heads: int,
        n_kv_heads: int,
        mlp_hidden: int,
        max_seq_len: int,
        num_experts: int = 4,
        top_k: int = 2,
        expert_hidden: int = 192,
        gating: str = "softmax",
        renormalize: bool = True,
        capacity_factor: float = 0.0,
        aux_loss_coef: float = 0.01,
        z_loss_coef: float = 0.001,
        shared_expert: bool = False,
        dense_layers: Sequence[int] = (),
        dense_hidden: int = 0,
        router_bias: bool = False,
        router_groups: int = 1,
        router_group_top_k: int = 1,
        routed_scale: float = 1.0,
        mlp_activation: str = "silu",
        **fields: Any,
    ):
        corrected = router_bias or router_groups > 1 or routed_scale != 1.0
        router = dict(bias=router_bias, groups=router_groups, group_top_k=router_group_top_k, scale=routed_scale) if corrected else None
        dense = set(dense_layers)

        def build_mlp(i: int) -> tuple[str, nn.Module]:
            if i in dense:
                return "mlp", SwiGLU(dim, dense_hidden or mlp_hidden, mlp_activation)
            shared_hidden = mlp_hidden if shared_expert else 0
            return "moe", MoE(dim, num_experts, top_k, expert_hidden, gating, renormalize, capacity_factor, shared_hidden, mlp_activation, router)

        super().__init__(vocab_size, dim, n_layers, n_heads, n_kv_heads, max_seq_len, build_mlp=build_mlp, **fields)
        self.aux_loss_coef = aux_loss_coef
        self.z_loss_coef = z_loss_coef
        self.moe_layers = [i for i in range(n_layers) if i not in dense]
        """The indices of the layers whose MLP is an MoE."""

    def _hidden_matrices(self) -> list[nn.Parameter]:
        """The blocks' linear layers (attention, routers, shared experts), then the stacked expert weights."""
        experts = [param for block in self.layers for module in block.modules() if isinstance(module, GroupedExperts) for param in module.parameters()]
        return super()._hidden_matrices() + experts

    def _reset_other(self, module: nn.Module, hidden_std: float, residual_std: float) -> None:
        if isinstance(module, GroupedExperts):
            # w1 and w3 are hidden matrices; w2 writes into the residual stream.
            module.reset_parameters(hidden_std, residual_std)

    def _moe_blocks(self) -> list[nn.Module]:
        """The blocks of moe_layers (every block under pipeline parallelism's kept layers, whose indices are global)."""
        return [block for block in self.layers if hasattr(block, "moe")]

    def auxiliary_loss(self) -> torch.Tensor:
        """aux_loss_coef * balance loss + z_loss_coef * z-loss of the last forward, summed over layers."""
        total = torch.zeros((), device=self.output.weight.device)
        for layer in self._moe_blocks():
            stats = layer.moe.stats
            if stats is not None:
                total = total + self.aux_loss_coef * stats.aux_loss + self.z_loss_coef * stats.z_loss
        return total

    def training_metrics(self) -> dict[str, float]:
        """Per layer i: moe/layer{i}/load/e{j} (share of assignments to expert j), drop_rate, aux_loss, z_loss."""
        names, values = [], []
        for i, layer in zip(self.moe_layers, self._moe_blocks()):
            stats = layer.moe.stats
            if stats is None:
                continue
            prefix = f"moe/layer{i}"
            names += [f"{prefix}/load/e{j}" for j in range(stats.load.numel())]
            names += [f"{prefix}/drop_rate", f"{prefix}/aux_loss", f"{prefix}/z_loss"]
            values += [stats.load, stats.drop_rate.view(1), stats.aux_loss.detach().view(1), stats.z_loss.detach().view(1)]
        if not values:
            return {}
        # One device-to-host copy for all layers instead of one per scalar.
        flat = torch.cat([v.float() for v in values]).tolist()
        return dict(zip(names, flat))
