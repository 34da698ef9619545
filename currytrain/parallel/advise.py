"""currytrain advise: per-rank memory and communication of candidate parallel layouts, and what to add next.

A first-order model, from the config alone (the model is built on the meta device to count its parameters):

- state bytes per rank: fp32 parameters and gradients, and the optimizer's fp32 moments (AdamW 2, SGD 1), divided
  by tp and pp (and the experts by ep), and by the data-parallel ranks for what the ZeRO stage shards;
- activations per rank: estimate.py's per-token-and-layer bytes for the tokens this rank holds (its batch slice,
  its 1/cp of the sequence, its 1/pp of the layers, 1/tp of the widths under sequence parallelism), with and
  without full activation checkpointing, plus the logits (1/tp of the vocabulary);
- communication per step and rank (bytes sent): ring all-reduce of the gradients 2(d-1)/d, ZeRO-3's parameter
  all-gathers, TP's four sequence-parallel collectives per layer forward and backward, CP's key/value ring,
  EP's two all_to_alls per MoE layer forward and backward, PP's activations at each stage boundary.

Its accuracy against measured runs: docs/parallelism.md (bench/advise_memory.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from omegaconf import DictConfig

from currytrain.estimate import OPTIMIZER_STATES, GiB


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
        zero = {0: "ddp", 1: "zero1", 2: "zero2", 3: "fsdp"}[self.zero_stage]
        axes = [f"{zero}{self.dp}"] + [f"{axis}{degree}" for axis, degree in (("tp", self.tp), ("pp", self.pp), ("cp", self.cp), ("ep", self.ep)) if degree > 1]
        return " x ".join(axes)


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


def count_split_parameters(model_cfg: DictConfig) -> tuple[int, int]:
    """(dense parameters, routed-expert parameters), counted exactly on the meta device."""
    import torch

    from currytrain.model import build_model
    from currytrain.model.moe import GroupedExperts

    with torch.device("meta"):
        model = build_model(model_cfg)
    experts = sum(p.numel() for module in model.modules() if isinstance(module, GroupedExperts) for p in module.parameters())
    return sum(p.numel() for p in model.parameters()) - experts, experts


def predict(cfg: DictConfig, layout: Layout, dense: int, experts: int) -> Prediction:
    model, trainer = cfg.model, cfg.trainer
    per_rank = dense / (layout.tp * layout.pp) + experts / (layout.ep * layout.pp)
    shard = lambda stage: layout.dp if layout.zero_stage >= stage else 1  # noqa: E731 (how much a ZeRO stage divides)
    states = OPTIMIZER_STATES.get(cfg.optimizer.get("_target_"), 2)
    params, grads, optimizer = 4 * per_rank / shard(3), 4 * per_rank / shard(2), 4 * states * per_rank / shard(1)
    element = 2 if trainer.precision == "bf16" else 4
    tokens = trainer.batch_size / layout.dp * cfg.data.seq_len / layout.cp
    hidden = model.get("expert_hidden", 0) * model.get("top_k", 0) + model.get("mlp_hidden", 0)
    layers = model.n_layers / layout.pp
    activations = tokens * layers * (10 * model.dim + 4 * hidden) * element / layout.tp
    activations_ac = tokens * layers * model.dim * element / layout.tp
    logits = tokens * model.vocab_size * 4 * 3 / layout.tp  # logits, their fp32 copy, the loss gradient
    comm = _communication(cfg, layout, per_rank, tokens, element)
    return Prediction(layout.name, int(params), int(grads), int(optimizer), int(activations + logits), int(activations_ac + logits), int(comm))


def _communication(cfg: DictConfig, layout: Layout, per_rank: float, tokens: float, element: int) -> float:
    model = cfg.model
    ring = lambda n: (n - 1) / n if n > 1 else 0.0  # noqa: E731 (share of a buffer each rank sends in a ring collective)
    grad_bytes = 4 * per_rank
    total = 2 * grad_bytes * ring(layout.dp)  # all-reduce (reduce-scatter + all-gather under ZeRO-2/3)
    if layout.zero_stage == 3:
        total += 2 * 4 * per_rank * ring(layout.dp)  # parameters gathered again for forward and backward
    layers = model.n_layers / layout.pp
    full_tokens = tokens * layout.cp
    total += 8 * layers * full_tokens * model.dim * element * ring(layout.tp)  # SP all-gather/reduce-scatter x2, fwd+bwd
    kv_dim = 2 * model.n_kv_heads * (model.get("head_dim", 0) or model.dim // model.n_heads)
    total += 3 * layers * tokens * kv_dim * element * max(layout.cp - 1, 0)  # k/v round the ring; backward with grads
    if layout.ep > 1:
        total += 4 * layers * tokens * model.get("top_k", 1) * model.dim * element * ring(layout.ep)
    if layout.pp > 1:
        total += 2 * tokens * model.dim * element  # activations forward, their gradients backward, per boundary
    return total


def candidate_layouts(cfg: DictConfig, world: int) -> list[Layout]:
    """The ladder the advice climbs: data parallel and its ZeRO stages, then TP within a node (<= 8), then PP;
    EP for MoE; CP for long sequences. Only layouts whose degrees fit the model and the world."""
    model = cfg.model
    layouts = [Layout(world, stage) for stage in (0, 1, 2, 3)]
    for tp in (2, 4, 8):
        if world % tp == 0 and model.n_heads % tp == 0 and model.n_kv_heads % tp == 0:
            layouts.append(Layout(world // tp, 3, tp=tp))
    for pp in (2, 4):
        if world % (pp * 8) == 0 and model.n_layers % pp == 0 and model.n_heads % 8 == 0:
            layouts.append(Layout(world // (8 * pp), 3, tp=8, pp=pp))
    if "num_experts" in model:
        layouts += [Layout(world, 0, ep=ep) for ep in (2, 4, 8) if world % ep == 0 and model.num_experts % ep == 0]
    layouts += [Layout(world // cp, 0, cp=cp) for cp in (2, 4) if world % cp == 0 and cfg.data.seq_len % (2 * cp) == 0]
    return layouts


def advise(cfg: DictConfig, world: int, device_bytes: int) -> dict:
    """Predictions for every candidate layout and the recommendation: the first on the ladder that fits."""
    dense, experts = count_split_parameters(cfg.model)
    predictions = [predict(cfg, layout, dense, experts) for layout in candidate_layouts(cfg, world)]
    fits = [p for p in predictions if p.peak <= device_bytes]
    fits_ac = [p for p in predictions if p.peak_ac <= device_bytes]
    reasons = []
    if fits:
        choice = fits[0]
        reasons.append(f"{choice.layout}: the simplest layout whose predicted peak ({choice.peak / GiB:,.2f} GiB) fits in {device_bytes / GiB:,.0f} GiB")
    elif fits_ac:
        choice = fits_ac[0]
        reasons.append(
            f"{choice.layout} with model.ac=full: nothing fits without activation checkpointing; with it the peak is {choice.peak_ac / GiB:,.2f} GiB"
        )
    else:
        choice = min(predictions, key=lambda p: p.peak_ac)
        reasons.append(
            f"nothing fits in {device_bytes / GiB:,.0f} GiB: the smallest is {choice.layout} at {choice.peak_ac / GiB:,.2f} GiB with ac=full; add GPUs or shrink the model"
        )
    ddp = predictions[0]
    if ddp.optimizer > ddp.activations:
        reasons.append("optimizer state outweighs activations: ZeRO-1 (parallel=zero1) is the cheapest saving")
    if "num_experts" in cfg.model and experts > dense:
        reasons.append("most parameters are experts: add expert parallelism (parallel.ep) before tensor parallelism")
    if cfg.data.seq_len >= 8192:
        reasons.append(f"data.seq_len={cfg.data.seq_len} is long: context parallelism (parallel.cp) splits the activations by sequence")
    return {
        "world": world,
        "device_bytes": device_bytes,
        "num_params": dense + experts,
        "layouts": [p.as_dict() for p in predictions],
        "recommended": choice.layout,
        "reasons": reasons,
    }


def print_advice(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"per-rank memory and communication at {result['world']} ranks ({result['num_params']:,} parameters)")
    for column in ("layout", "params", "grads", "optimizer", "activations", "peak", "peak ac=full", "comm/step"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    for row in result["layouts"]:
        mark = " *" if row["layout"] == result["recommended"] else ""
        sizes = [row[key] for key in ("params", "grads", "optimizer", "activations", "peak", "peak_ac", "comm_bytes")]
        table.add_row(row["layout"] + mark, *(_size(value) for value in sizes))
    console = Console(width=max(Console().width, 120))
    console.print(table)
    for reason in result["reasons"]:
        console.print(f"- {reason}")


def _size(value: float) -> str:
    return f"{value / GiB:,.2f} GiB" if value >= GiB else f"{value / 2**20:,.1f} MiB"


def parse_bytes(text: str) -> int:
    """'80GiB', '80GB', '512MiB' or a plain number of bytes."""
    units = {"gib": 2**30, "gb": 10**9, "mib": 2**20, "mb": 10**6, "kib": 2**10, "kb": 10**3, "b": 1}
    lowered = text.strip().lower()
    for unit, factor in units.items():
        if lowered.endswith(unit):
            return int(float(lowered[: -len(unit)]) * factor)
    return int(math.floor(float(lowered)))
