"""trainer.compile: torch.compile per block, the compiled loss, the persistent compile cache and what the
compilation cost (journaled as the `compile` event)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

USER_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
"""A cache folder the user chose before curryTrain started; it wins over the run folder's."""


def apply_compile(model: nn.Module) -> None:
    """torch.compile each block of `model.layers` in place (nn.Module.compile keeps the parameter names, so
    checkpoints load with and without compile). The blocks share one code object, so one compiled graph
    serves them all; the embedding and the output layer stay eager (the compiled loss takes the logits)."""
    for block in model.layers:
        block.compile()


def compile_loss(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss compiled: the upcast, log-softmax and gather fuse instead of materializing fp32 logits twice."""
    return torch.compile(loss_fn)


def use_compile_cache(folder: Path) -> None:
    """Keep inductor's compiled kernels and graphs in `folder` (the runs' shared parent), so the next run of
    the same shapes loads them instead of compiling; $TORCHINDUCTOR_CACHE_DIR set by the user wins."""
    if USER_CACHE is None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(folder).resolve())


def compile_report(first_step_seconds: float) -> dict[str, Any]:
    """What compilation cost so far: the first step's seconds (which include it), dynamo's and inductor's
    own compile seconds, the graphs compiled, and the FX-graph cache's hits and misses."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    def seconds(name: str) -> float:
        return round(sum(compilation_time_metrics.get(name, [])), 3)

    return {
        "first_step_seconds": round(first_step_seconds, 3),
        "dynamo_seconds": seconds("_compile.compile_inner"),
        "inductor_seconds": seconds("compile_fx_inner"),
        "graphs": int(counters["stats"]["unique_graphs"]),
        "cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
        "cache_misses": int(counters["inductor"]["fxgraph_cache_miss"]),
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""),
    }
