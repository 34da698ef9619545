"""trainer.compile: on one process the forward and the loss compiled as one graph; with parallelism torch.compile
per block and the compiled loss; the persistent compile cache and what the compilation cost (journaled as the
`compile` event)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from currytrain.model.protocol import ForwardLoss, model_loss
from currytrain.parallel.state import ParallelState

_SET_HERE: set[str] = set()
"""The cache folders use_compile_cache chose in this process."""


def user_cache() -> str | None:
    """A cache folder the user chose; it wins over the run folder's. inductor writes its own default into
    $TORCHINDUCTOR_CACHE_DIR the first time it looks, and earlier runs in this process wrote theirs: neither
    counts as a choice."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return None if chosen is None or chosen == default_cache_dir() or chosen in _SET_HERE else chosen


def apply_compile(model: nn.Module) -> None:
    """torch.compile each block of `model.layers` in place (nn.Module.compile keeps the parameter names, so
    checkpoints load with and without compile). The blocks share one code object, so one compiled graph
    serves them all; the embedding and the output layer stay eager (the compiled loss takes the logits)."""
    for block in model.layers:
        block.compile()


def compiles_whole(state: ParallelState) -> bool:
    """Whether trainer.compile compiles the forward and the loss as one graph (compile_forward_loss): on one process
    with the model whole (no mesh: no DDP, FSDP, TP, CP, EP or PP hooks or DTensors in the graph) and not under
    Fabric. Measured on the 2-core CPU (docs/performance.md): tiny fp32 1.31x eager against 1.23x per block; with
    parallelism the blocks are compiled apart, so that the wrappers' collectives and hooks stay outside the graphs."""
    return state.mesh is None and state.fabric is None


def compile_forward_loss(model: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], data: Any = None) -> ForwardLoss:
    """model_loss(model, loss_fn) compiled as one function: embedding, blocks, readout and loss in one graph, so
    inductor fuses across the block boundaries and the logits' upcast into the cross-entropy. The model itself is
    left as it is (eval, checkpoints and `hf export` see the plain module)."""
    return torch.compile(model_loss(model, loss_fn, data))


def compile_loss(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss compiled: the upcast, log-softmax and gather fuse instead of materializing fp32 logits twice."""
    return torch.compile(loss_fn)


def use_compile_cache(folder: Path) -> None:
    """Keep inductor's compiled kernels and graphs in `folder` (the runs' shared parent), so the next run of
    the same shapes loads them instead of compiling; $TORCHINDUCTOR_CACHE_DIR set by the user wins."""
    if user_cache() is None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(folder).resolve())
        _SET_HERE.add(os.environ["TORCHINDUCTOR_CACHE_DIR"])


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
