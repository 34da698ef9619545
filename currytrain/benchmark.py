"""Benchmarking entry points: one optimizer step (forward + backward + step over N microbatches), and
the pieces the scripts in bench/ share to build what they time and to time two setups side by side."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig

from currytrain.components import Components, build_components
from currytrain.model.protocol import find_blocks, token_loss_sum
from currytrain.parallel.state import ParallelState, resolve_device
from currytrain.trainer.step import StepResult, run_accumulated_step

__all__ = [
    "run_accumulated_step",
    "StepResult",
    "token_loss_sum",
    "build_step_setup",
    "Components",
    "alternating_step_times",
    "balanced_orders",
]


def build_step_setup(cfg: DictConfig, state: ParallelState | None = None) -> Components:
    """What one optimizer step needs, built exactly as a run builds it (build_components), by default for
    one process on trainer.device."""
    return build_components(cfg, state or ParallelState(device=resolve_device(cfg.trainer.device)))


def alternating_step_times(
    steps: dict[str, Callable[[int], Any]], *, rounds: int, per_round: int = 1, warmup: int = 0, offset: int = 0
) -> dict[str, list[float]]:
    """Seconds of each call of each named step function (called with a step index), taking turns:
    `per_round` calls of each per round, so load from other processes hits all of them alike. The rounds' orders
    follow a balanced Latin square (balanced_orders): over len(orders) rounds every contender runs first equally
    often and right after each other one equally often, so none always inherits the same predecessor's state
    (its memory traffic in the caches, a compiled kernel's OpenMP threads still spinning). `warmup` untimed rounds
    come first; `offset` starts at a later row of the square (a later repeat can take the rows an earlier one did not)."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    orders = balanced_orders(len(names))
    for index in range(warmup + rounds):
        for position in orders[(offset + index) % len(orders)]:
            name = names[position]
            for call in range(per_round):
                tic = time.perf_counter()
                steps[name](index * per_round + call)
                if index >= warmup:
                    times[name].append(time.perf_counter() - tic)
    return times


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of 0..n-1 in which each one comes first equally often and each ordered pair (a right before b)
    equally often: Williams' balanced Latin square (n rows; for odd n, also each row reversed, 2n rows)."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(position + shift) % n for position in first] for shift in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 else rows


def matmul_roofline(size: int, dtype: torch.dtype, device: torch.device, repeats: int = 10) -> float:
    """FLOP/s of a square matmul of `size` in `dtype` on `device`: what this machine's matmuls reach at best."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    times = []
    for _ in range(repeats + 2):
        _synchronize(device)
        tic = time.perf_counter()
        a @ b
        _synchronize(device)
        times.append(time.perf_counter() - tic)
    return 2 * size**3 / min(times[2:])


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_flops_per_token(model: torch.nn.Module, n_layers: int, dim: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 x non-embedding parameters (forward 2, backward 4) plus attention's
    12 x layers x dim x seq (scores and weighted sum, forward and backward)."""
    embedding = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)  # the token table comes first
    params = sum(p.numel() for p in model.parameters()) - (embedding.weight.numel() if embedding is not None else 0)
    return 6 * params + 12 * n_layers * dim * seq_len


def model_sizes(model: torch.nn.Module, model_cfg) -> tuple[int, int]:
    """(blocks, width) of any model: its repeated blocks (currytrain.model.protocol.find_blocks) and its token
    embedding's width, else model.dim."""
    embedding = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
    width = embedding.embedding_dim if embedding is not None else int(model_cfg.get("dim", 0) or 0)
    return len(find_blocks(model)), width


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the process's peak RSS (KiB on Linux)


def _split_step(parts: Components, microbatches: list) -> dict[str, float]:
    """Seconds of forward, backward and optimizer (clip + step) of one step, each synchronized."""
    device, split = parts.state.device, {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    autocast = parts.autocast_dtype
    normalization = parts.normalization
    scale = 1 / max(1, sum(normalization.count(targets) for _, targets in microbatches))
    for inputs, targets in microbatches:
        inputs, targets = inputs.to(device), targets.to(device)
        tic = time.perf_counter()
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            task, auxiliary = parts.forward_loss(inputs, targets)
            loss = task.total * scale + (auxiliary / len(microbatches) if auxiliary is not None else 0)
        _synchronize(device)
        split["forward"] += time.perf_counter() - tic
        tic = time.perf_counter()
        loss.backward()
        _synchronize(device)
        split["backward"] += time.perf_counter() - tic
    tic = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(parts.model.parameters(), parts.cfg.trainer.grad_clip or float("inf"))
    parts.optimizer.step()
    parts.optimizer.zero_grad(set_to_none=True)
    _synchronize(device)
    split["optimizer"] = time.perf_counter() - tic
    return split


def step_benchmark(cfg: DictConfig, steps: int = 20, warmup: int = 3) -> dict[str, Any]:
    """Time `steps` optimizer steps of the run `cfg` describes (run_accumulated_step, after `warmup` untimed
    ones, which pay trainer.compile's compilation: warmup_seconds), then a few instrumented steps for the forward/backward/optimizer split. Seeded by cfg.seed."""
    import statistics

    parts = build_step_setup(cfg)
    trainer, device = cfg.trainer, parts.state.device
    batches = [[parts.data.batch("train", step, m, trainer.batch_size) for m in range(trainer.grad_accum)] for step in range(warmup + steps)]
    times = []
    for microbatches in batches:
        _synchronize(device)
        tic = time.perf_counter()
        run_accumulated_step(
            parts.model,
            parts.optimizer,
            microbatches,
            forward_loss=parts.forward_loss,
            normalization=parts.normalization,
            grad_clip=trainer.grad_clip,
            autocast_dtype=parts.autocast_dtype,
            loss_context=parts.state.loss_context,
        )
        _synchronize(device)
        times.append(time.perf_counter() - tic)
    warmup_seconds, times = sum(times[:warmup]), times[warmup:]
    splits = [_split_step(parts, batches[index % len(batches)]) for index in range(3)]
    seq_len = int(parts.data.seq_len)
    tokens = trainer.batch_size * trainer.grad_accum * seq_len
    median = statistics.median(times)
    n_layers, width = model_sizes(parts.module, cfg.model)
    flops_per_token = model_flops_per_token(parts.module, n_layers, width, seq_len)
    dtype = parts.autocast_dtype or torch.float32
    # CPU: near the model's own shapes; a GPU reaches its best only on large products (at 2048 an H200 shows
    # about half of what it does at 8192), so the roofline there is the card's, not the shapes'.
    roofline = matmul_roofline(8192 if device.type == "cuda" else max(256, min(2048, 4 * width)), dtype, device)
    return {
        "config": {"model": cfg.model._target_, "dim": width, "n_layers": n_layers, "seq_len": seq_len},
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "steps": steps,
        "tokens_per_step": tokens,
        "compile": trainer.compile,
        "warmup_seconds": warmup_seconds,
        "step_seconds": {"median": median, "min": min(times), "max": max(times)},
        "tokens_per_s": tokens / median,
        "model_flops_per_token": flops_per_token,
        "achieved_flops_per_s": flops_per_token * tokens / median,
        "roofline_flops_per_s": roofline,
        "mfu": flops_per_token * tokens / median / roofline,
        "peak_memory_bytes": _peak_memory_bytes(device),
        "split_seconds": {name: statistics.median(split[name] for split in splits) for name in ("forward", "backward", "optimizer")},
    }
