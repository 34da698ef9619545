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

from omegaconf import DictConfig, OmegaConf

# The per-rank model lives in currytrain.estimate, where validation's memory check uses it too.
from currytrain.estimate import GiB, Layout, Prediction, candidate_layouts, count_split_parameters, predict

__all__ = ["Layout", "Prediction", "advise", "candidate_layouts", "count_split_parameters", "offered_layouts", "parse_bytes", "predict", "print_advice"]


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
