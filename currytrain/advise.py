"""currytrain advise: per-rank memory and communication of candidate parallel layouts, and what to add next.

A first-order model, from the config alone (the model is built on the meta device to count its parameters):

- state bytes per rank: fp32 parameters and gradients, and the optimizer's fp32 moments (AdamW 2, SGD 1), divided
  by pp, by tp for what tensor parallelism splits (not the norms, nor model=moe's router, experts and shared expert,
  which apply_tp replicates), the experts by ep, and by the data-parallel ranks for what the ZeRO stage shards;
- activations per rank: estimate.py's per-token-and-layer bytes for the tokens this rank holds (its batch slice,
  its 1/cp of the sequence, its 1/pp of the layers, 1/tp of the widths under sequence parallelism; model=moe's MoE
  layers see the whole sequence on every tp rank), with and without full activation checkpointing, plus the logits
  (1/tp of the vocabulary);
- communication per step and rank (bytes sent): ring all-reduce of the gradients 2(d-1)/d, ZeRO-3's parameter
  all-gathers, TP's four sequence-parallel collectives per layer forward and backward, CP's key/value ring,
  EP's two all_to_alls per MoE layer forward and backward, PP's activations at each stage boundary.

The candidates are a ladder of layouts (see candidate_layouts); only those validation accepts are offered: each is
checked by currytrain.validate.parallel_problems, the checks a run of it would meet, and the refused ones are listed
with validation's reason. Its accuracy against measured runs: docs/parallelism.md (bench/advise_memory.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

from omegaconf import DictConfig, OmegaConf

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
        model_axes = [f"{axis}{degree}" for axis, degree in (("tp", self.tp), ("pp", self.pp), ("cp", self.cp), ("ep", self.ep)) if degree > 1]
        return " x ".join(model_axes if self.dp == 1 and model_axes else [f"{zero}{self.dp}", *model_axes])

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
    tokens = trainer.batch_size / layout.dp * cfg.data.seq_len / layout.cp
    hidden = model.get("expert_hidden", 0) * model.get("top_k", 0) + model.get("mlp_hidden", 0)
    layers = model.n_layers / layout.pp
    # Per token and layer: attention and norms split by tp; the MLP too, but a replicated MoE layer holds the whole sequence.
    moe_tp = layout.tp if "num_experts" in model else 1
    activations = tokens * layers * (10 * model.dim + 4 * hidden * moe_tp) * element / layout.tp
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


def offered_layouts(cfg: DictConfig, world: int) -> tuple[list[Layout], dict[str, list[str]]]:
    """(the candidate layouts validation accepts for `cfg`, {refused layout: validation's problems})."""
    from currytrain.validate import parallel_problems

    offered, refused = [], {}
    for layout in candidate_layouts(cfg, world):
        candidate = OmegaConf.merge(cfg, OmegaConf.from_dotlist(layout.overrides(world)))
        problems = parallel_problems(candidate)
        if problems:
            refused[layout.name] = problems
        else:
            offered.append(layout)
    return offered, refused


def advise(cfg: DictConfig, world: int, device_bytes: int) -> dict:
    """Predictions for every layout validation accepts and the recommendation: the first on the ladder that fits."""
    counts = count_split_parameters(cfg.model)
    dense, experts = counts.dense, counts.experts
    layouts, refused = offered_layouts(cfg, world)
    predictions = [predict(cfg, layout, *counts) for layout in layouts]
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
    elif predictions:
        choice = min(predictions, key=lambda p: p.peak_ac)
        reasons.append(
            f"nothing fits in {device_bytes / GiB:,.0f} GiB: the smallest is {choice.layout} at {choice.peak_ac / GiB:,.2f} GiB with ac=full; add GPUs or shrink the model"
        )
    else:
        choice = None
        reasons.append(f"validation refuses every candidate layout at {world} ranks (see refused): change what their problems name")
    ddp = predict(cfg, Layout(world, 0), *counts)
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
        "layouts": [{**p.as_dict(), "overrides": layout.overrides(world)} for p, layout in zip(predictions, layouts)],
        "recommended": choice.layout if choice else None,
        "reasons": reasons,
        "refused": refused,
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
    for layout, problems in result["refused"].items():
        console.print(f"- not offered, validation refuses {layout}: {problems[0]}", markup=False)


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
