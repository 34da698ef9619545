"""trainer.compile: on one process the forward and the loss compiled as one graph; with parallelism torch.compile
per block and the compiled loss; the persistent compile cache and what the compilation cost (journaled as the
`compile` event)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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


def launch_dir() -> Path:
    """The directory launch.py was started in (Hydra's runtime.cwd, which a job that changed directory, a sweep
    trial and a SLURM job keep); outside a Hydra job, the working directory."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.cwd) if HydraConfig.initialized() else Path.cwd()


def detect_vec_isa(device: torch.device) -> float:
    """Have inductor choose the CPU's vector instruction set now, its candidates checked side by side, in the
    machine's cache; returns the seconds it took (0 where it was known already, the run is not on the CPU or the
    CPU is not x86).

    inductor checks each candidate the CPU claims (AVX2, AVX-512, VNNI, AMX, bf16) by compiling and loading a test
    library, one after another, the first time it compiles a kernel in a process: 11.7 s of the 24 s a cold TINY gqa
    took to compile on the 2-core AMX machine (docs/performance.md). Its answer belongs to the machine and the
    compiler, not to a project, so the test libraries go to inductor's per-user default cache (where it keeps its
    precompiled headers too) instead of the project's cache: a new project then pays only the loading checks.
    A check that fails here leaves the choice to inductor, as without this."""
    from torch._inductor import cpu_vec_isa

    if device.type != "cpu" or platform.machine() not in ("x86_64", "AMD64") or cpu_vec_isa.valid_vec_isa_list.cache_info().currsize:
        return 0.0
    started = time.perf_counter()
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    ours = chosen is not None and user_cache() is None
    if ours:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]
    try:
        flags = cpu_vec_isa.x86_isa_checker()
        candidates = [isa for isa in cpu_vec_isa.supported_vec_isa_list if all(flag in flags for flag in str(isa).split())]
        with ThreadPoolExecutor(max(1, len(candidates))) as pool:  # each instance is checked in one thread only
            list(pool.map(bool, candidates))
        cpu_vec_isa.valid_vec_isa_list()
    except Exception:  # torch's private API moved: inductor checks when it first compiles, as before
        pass
    finally:
        if ours:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = chosen
    return time.perf_counter() - started


def use_compile_cache(folder: str | Path) -> None:
    """Keep inductor's compiled kernels and graphs in `folder` (trainer.compile_cache: relative to launch_dir, so the
    project's runs share it), so the next run of the same shapes loads them instead of compiling;
    $TORCHINDUCTOR_CACHE_DIR set by the user wins."""
    if user_cache() is None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str((launch_dir() / Path(folder).expanduser()).resolve())
        _SET_HERE.add(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def compile_report(first_step_seconds: float, isa_seconds: float = 0.0) -> dict[str, Any]:
    """What compilation cost so far: the first step's seconds (which include it), dynamo's and inductor's
    own compile seconds, the seconds detect_vec_isa spent before the step, the graphs compiled, and the FX-graph
    cache's hits and misses."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    def seconds(name: str) -> float:
        return round(sum(compilation_time_metrics.get(name, [])), 3)

    return {
        "first_step_seconds": round(first_step_seconds, 3),
        "dynamo_seconds": seconds("_compile.compile_inner"),
        "inductor_seconds": seconds("compile_fx_inner"),
        "isa_seconds": round(isa_seconds, 3),
        "graphs": int(counters["stats"]["unique_graphs"]),
        "cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
        "cache_misses": int(counters["inductor"]["fxgraph_cache_miss"]),
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""),
    }


AUTO_PROBE_STEPS = 2
"""Eager steps trainer.compile=auto times, after the first (which warms up), before it chooses."""
COMPILE_SAVING = 0.2
"""The share of an eager step compilation is expected to save: conservative against what docs/performance.md measures
(tiny gqa fp32 on 2 CPU cores: 1.31x eager, a 24% saving)."""
DEFAULT_COMPILE_SECONDS = 60.0
"""The compile cost trainer.compile=auto assumes before a compiled run of the same setup has measured one (a cold
TINY 2-layer gqa or moe took 30-90 s on 2 loaded CPU cores; docs/performance.md)."""
COSTS_FILE = "compile_costs.jsonl"
"""In the compile cache folder: one line per compiled run, {signature, seconds} (its first step's seconds)."""


@dataclass
class CompileChoice:
    """What trainer.compile=auto chose, and why (journaled as the `compile_choice` event)."""

    compile: bool
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def event(self) -> dict[str, Any]:
        return {"choice": "compile" if self.compile else "eager", "reason": self.reason, **self.numbers}


def compile_signature(setup: dict[str, Any]) -> str:
    """A short key for what decides the compiled graphs (model config, shapes, precision, device, torch version)."""
    text = json.dumps({**setup, "torch": torch.__version__}, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def recorded_compile_seconds(cache_dir: Path, signature: str) -> float | None:
    """The latest compile cost measured for `signature` in `cache_dir` (warm when inductor's cache already held the
    graphs: then it is the cost of loading them), or None."""
    path = Path(cache_dir) / COSTS_FILE
    if not path.is_file():
        return None
    seconds = None
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a crash: the others still count
            continue
        if row.get("signature") == signature:
            seconds = float(row["seconds"])
    return seconds


def record_compile_seconds(cache_dir: Path, signature: str, seconds: float) -> None:
    """Append a compiled run's first-step seconds to the cache folder's record, for trainer.compile=auto to read."""
    path = Path(cache_dir) / COSTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps({"signature": signature, "seconds": round(seconds, 3)}) + "\n")


def choose_compile(eager_step_seconds: float, remaining_steps: int, compile_seconds: float, measured: bool) -> CompileChoice:
    """Compile when the eager time it is expected to save over the remaining steps exceeds what compiling costs."""
    saving = eager_step_seconds * remaining_steps * COMPILE_SAVING
    source = "measured by an earlier compiled run of this setup" if measured else "assumed: no compiled run of this setup has measured one"
    numbers = {
        "eager_step_seconds": round(eager_step_seconds, 4),
        "remaining_steps": remaining_steps,
        "expected_saving_seconds": round(saving, 2),
        "compile_seconds": round(compile_seconds, 2),
        "compile_seconds_source": "measured" if measured else "assumed",
    }
    verdict = "repays" if saving > compile_seconds else "does not repay"
    reason = (
        f"{remaining_steps} remaining steps x {eager_step_seconds:.3f} s eager x {COMPILE_SAVING:.0%} expected saving = {saving:.1f} s "
        f"{verdict} a compilation of {compile_seconds:.1f} s, {source}"
    )
    return CompileChoice(saving > compile_seconds, reason, numbers)
