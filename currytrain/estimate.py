"""What a run will need before it runs: parameters counted exactly on the meta device (nothing allocated),
then bytes of weights, gradients, optimizer state and activations per process.

Validation refuses a run whose estimate exceeds the device's memory, so `model.dim=1000000` gets a number
and a fix instead of an attempt to allocate terabytes. The activation term is a rough upper estimate
(what autograd keeps per token and layer in a pre-norm GQA/SwiGLU block, plus the logits); the
parameter, gradient and optimizer terms are exact for fp32 AdamW.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import NamedTuple

from omegaconf import DictConfig

GiB = 2**30
OPTIMIZER_STATES = {"currytrain.optim.builders.build_adamw": 2, "currytrain.optim.builders.build_sgd": 1}
"""fp32 tensors of state per parameter (AdamW: two moments; SGD: momentum)."""


@dataclass
class MemoryEstimate:
    num_params: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    data: int = 0
    """Bytes of a data source generated in memory (data=synthetic)."""
    rough: bool = False
    """num_params is an upper estimate from the size fields (a model too large to build even on the meta device)."""

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.data

    def describe(self) -> str:
        parts = [("weights", self.weights), ("gradients", self.gradients), ("optimizer state", self.optimizer), ("activations", self.activations)]
        parts += [("data", self.data)] if self.data else []
        count = f"{'about ' if self.rough else ''}{self.num_params:,} parameters"
        return f"{self.total / GiB:,.1f} GiB ({', '.join(f'{name} {size / GiB:,.1f}' for name, size in parts)}; {count})"


def count_parameters(model_cfg: DictConfig) -> int:
    """Exact, from the model built on the meta device: shapes only, no memory."""
    from currytrain.model import build_shapes

    model = build_shapes(model_cfg)
    return sum(p.numel() for p in model.parameters())


def rough_parameters(model: DictConfig) -> int | None:
    """An upper estimate of a decoder's (or classifier's) parameters, RoPE tables included, from its size fields
    alone; None for a model without them (a project's own). Cheap where building would not be: n_layers=10**11."""

    def size(key: str) -> int:
        value = model.get(key, 0)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    dim, layers = size("dim"), size("n_layers")
    if not dim or not layers:
        return None
    heads, kv_heads = max(1, size("n_heads")), max(1, size("n_kv_heads"))
    head = size("head_dim") or max(1, dim // heads)
    attention = dim * head * (heads + 2 * kv_heads) + heads * head * dim
    mlp = 3 * dim * size("mlp_hidden") + size("num_experts") * (3 * dim * size("expert_hidden") + dim)
    embeddings = 2 * (size("vocab_size") + size("in_features") + size("num_classes")) * dim
    return embeddings + layers * (attention + mlp + 2 * dim) + size("max_seq_len") * head


def data_bytes(data: DictConfig) -> int:
    """Bytes a data source generates in memory before training (data=synthetic: its int32 streams)."""
    num_tokens = data.get("num_tokens", 0)
    return int(num_tokens * 1.1) * 4 if isinstance(num_tokens, int) and num_tokens > 0 else 0


def estimate_memory(cfg: DictConfig, limit: int | None = None) -> MemoryEstimate:
    """Bytes one process needs for the run `cfg` (fp32 weights, gradients and optimizer state). With `limit`, a
    model whose rough size (rough_parameters) alone needs more than it is not built, even on the meta device."""
    model, trainer = cfg.model, cfg.trainer
    rough = rough_parameters(model)
    too_big = limit is not None and rough is not None and 16 * rough > limit
    num_params = rough if too_big else count_parameters(model)
    tokens = trainer.batch_size * cfg.data.get("seq_len", 1)  # tables (data=digits) have one row per example
    element = 2 if trainer.precision in ("bf16", "fp8") else 4
    hidden = model.get("expert_hidden", 0) * model.get("top_k", 0) + model.get("mlp_hidden", 0)
    per_token_layer = 10 * model.get("dim", 0) + 4 * hidden  # norms, q/k/v, attention out, residuals; SwiGLU's three
    if model.get("ac", "none") == "full":
        per_token_layer = model.get("dim", 0)  # only each block's input is kept
    activations = tokens * model.get("n_layers", 0) * per_token_layer * element * model.get("timesteps", 1)
    # A classifier (model=mlp) has num_classes outputs where a decoder has vocab_size.
    activations += tokens * model.get("vocab_size", model.get("num_classes", 0)) * 4 * 3  # logits, their fp32 copy, the loss gradient
    states = OPTIMIZER_STATES.get(cfg.optimizer.get("_target_"), 2)
    return MemoryEstimate(num_params, 4 * num_params, 4 * num_params, 4 * states * num_params, activations, data_bytes(cfg.data), too_big)


def on_gpu(device: str) -> bool:
    """Whether trainer.device trains on a GPU (each rank its own) rather than the CPU (every rank in one RAM)."""
    import torch

    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def device_memory(device: str) -> tuple[int, str]:
    """(bytes a new run can use, a name for the message) on trainer.device."""
    import torch

    if on_gpu(device):
        return torch.cuda.mem_get_info()[1], f"the GPU ({torch.cuda.get_device_name()})"
    return _available_ram(), "this machine's available RAM"


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as file:
            fields = dict(line.split(":", 1) for line in file)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ------------------------------------------------------------------------------------------ per rank, by layout
# currytrain advise (its docstring explains the model) and validation's memory check predict a rank's bytes here.


@dataclass(frozen=True)
class Layout:
    dp: int
    zero_stage: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    @property
    def name(self) -> str:
        """The degrees, with the data-parallel strategy named apart from its degree: `dp8 zero1`, `dp2 fsdp x tp4`, `tp8`."""
        zero = {0: "ddp", 1: "zero1", 2: "zero2", 3: "fsdp"}[self.zero_stage]
        model_axes = [f"{axis}{degree}" for axis, degree in (("tp", self.tp), ("pp", self.pp), ("cp", self.cp), ("ep", self.ep)) if degree > 1]
        return " x ".join(model_axes if self.dp == 1 and model_axes else [f"dp{self.dp} {zero}", *model_axes])

    def overrides(self, world: int) -> list[str]:
        """The launch.py overrides that run this layout on `world` processes."""
        sharded = self.zero_stage >= 2  # ZeRO-2/3 shard over dp_shard; DDP and ZeRO-1 replicate over dp_replicate
        degrees = {
            "nproc": world,
            "dp_replicate": 1 if sharded else self.dp,
            "dp_shard": self.dp if sharded else 1,
            "zero_stage": self.zero_stage,
            **{axis: getattr(self, axis) for axis in ("tp", "pp", "cp", "ep")},
        }
        return [f"parallel.{key}={value}" for key, value in degrees.items()]


@dataclass
class Prediction:
    layout: str
    params: int
    grads: int
    optimizer: int
    activations: int
    activations_ac: int
    comm_bytes: int

    @property
    def peak(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations

    @property
    def peak_ac(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations_ac

    def as_dict(self) -> dict:
        return {**asdict(self), "peak": self.peak, "peak_ac": self.peak_ac}


class ParameterCounts(NamedTuple):
    dense: int
    """Parameters outside the routed experts (router and shared expert included)."""
    experts: int
    """Routed-expert parameters (model=moe): what ep shares out."""
    tp_replicated: int
    """Dense parameters every tp rank holds whole: the norms (sequence parallel) and model=moe's routers and shared experts."""


def count_split_parameters(model_cfg: DictConfig) -> ParameterCounts:
    """The model's parameters by how the layouts split them, counted exactly on the meta device."""
    from currytrain.model import build_shapes
    from currytrain.model.layers import RMSNorm
    from currytrain.model.moe import GroupedExperts, MoE

    model = build_shapes(model_cfg)
    count = lambda types: sum(p.numel() for module in model.modules() if isinstance(module, types) for p in module.parameters())  # noqa: E731
    experts = count(GroupedExperts)
    # apply_tp's plan: norms SequenceParallel (whole weights), each MoE layer replicated whole (its experts are counted apart).
    replicated = count(RMSNorm) + count(MoE) - experts
    return ParameterCounts(sum(p.numel() for p in model.parameters()) - experts, experts, replicated)


def predict(cfg: DictConfig, layout: Layout, dense: int, experts: int, tp_replicated: int = 0) -> Prediction:
    model, trainer = cfg.model, cfg.trainer
    per_rank = ((dense - tp_replicated) / layout.tp + tp_replicated + experts / layout.ep) / layout.pp
    shard = lambda stage: layout.dp if layout.zero_stage >= stage else 1  # noqa: E731 (how much a ZeRO stage divides)
    states = OPTIMIZER_STATES.get(cfg.optimizer.get("_target_"), 2)
    params, grads, optimizer = 4 * per_rank / shard(3), 4 * per_rank / shard(2), 4 * states * per_rank / shard(1)
    element = 2 if trainer.precision in ("bf16", "fp8") else 4
    tokens = trainer.batch_size / layout.dp * cfg.data.get("seq_len", 1) / layout.cp  # tables (data=digits): one row per example
    hidden = model.get("expert_hidden", 0) * model.get("top_k", 0) + model.get("mlp_hidden", 0)
    # A project's own model may lack any size field: what it lacks counts as 0 (its parameters are still exact).
    layers, dim = model.get("n_layers", 0) / layout.pp, model.get("dim", 0)
    # Per token and layer: attention and norms split by tp; the MLP too, but a replicated MoE layer holds the whole sequence.
    moe_tp = layout.tp if "num_experts" in model else 1
    activations = tokens * layers * (10 * dim + 4 * hidden * moe_tp) * element * model.get("timesteps", 1) / layout.tp
    activations_ac = tokens * layers * dim * element / layout.tp
    # logits, their fp32 copy, the loss gradient (a classifier (model=mlp) has num_classes outputs)
    logits = tokens * model.get("vocab_size", model.get("num_classes", 0)) * 4 * 3 / layout.tp
    comm = _communication(cfg, layout, per_rank, tokens, element)
    return Prediction(layout.name, int(params), int(grads), int(optimizer), int(activations + logits), int(activations_ac + logits), int(comm))


def _communication(cfg: DictConfig, layout: Layout, per_rank: float, tokens: float, element: int) -> float:
    model = cfg.model
    ring = lambda n: (n - 1) / n if n > 1 else 0.0  # noqa: E731 (share of a buffer each rank sends in a ring collective)
    dim, heads = model.get("dim", 0), model.get("n_heads", 0) or 1
    grad_bytes = 4 * per_rank
    total = 2 * grad_bytes * ring(layout.dp)  # all-reduce (reduce-scatter + all-gather under ZeRO-2/3)
    if layout.zero_stage == 3:
        total += 2 * 4 * per_rank * ring(layout.dp)  # parameters gathered again for forward and backward
    layers = model.get("n_layers", 0) / layout.pp
    full_tokens = tokens * layout.cp
    total += 8 * layers * full_tokens * dim * element * ring(layout.tp)  # SP all-gather/reduce-scatter x2, fwd+bwd
    kv_dim = 2 * model.get("n_kv_heads", heads) * (model.get("head_dim", 0) or dim // heads)
    total += 3 * layers * tokens * kv_dim * element * max(layout.cp - 1, 0)  # k/v round the ring; backward with grads
    if layout.ep > 1:
        total += 4 * layers * tokens * model.get("top_k", 1) * dim * element * ring(layout.ep)
    if layout.pp > 1:
        total += 2 * tokens * dim * element  # activations forward, their gradients backward, per boundary
    return total


def candidate_layouts(cfg: DictConfig, world: int) -> list[Layout]:
    """The ladder the advice climbs, layouts of `world` ranks: data parallel and its ZeRO stages, then TP within a
    node (<= 8; FSDP over the rest), then PP (replicated over the rest); EP for MoE; CP for long sequences.
    Whether the model, data and trainer allow each is validation's to say (offered_layouts)."""
    layouts = [Layout(world, stage) for stage in (0, 1, 2, 3)]
    layouts += [Layout(world // tp, 3 if tp < world else 0, tp=tp) for tp in (2, 4, 8) if world % tp == 0]
    layouts += [Layout(world // pp, 0, pp=pp) for pp in (2, 4) if world % pp == 0]
    if "num_experts" in cfg.model:
        layouts += [Layout(world, 0, ep=ep) for ep in (2, 4, 8) if world % ep == 0]
    layouts += [Layout(world // cp, 0, cp=cp) for cp in (2, 4) if world % cp == 0]
    return layouts
