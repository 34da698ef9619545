"""trainer.attention_precision: the dtype the attention kernel runs in under a 16-bit autocast.

On the CPU, torch's fused attention (SDPA's flash kernel) is slower backward in bf16 than in fp32 at short
sequences: measured on a 2-core AVX-512/AMX Xeon (torch 2.13), forward + backward of a causal GQA attention call on
16 x 128 tokens takes 22.5 ms in bf16 and 5.0 ms in fp32 (4 heads of 32), 77.3 and 25.9 ms (12 heads of 64), while
at 1 x 2048 tokens bf16 wins (docs/performance.md, trainer.attention_precision). Where the crossover lies depends on the
CPU and the shapes, so `auto` times both dtypes at the run's shapes (a few calls, once per shape and process) and
runs the attention in fp32 where that is clearly faster; fp32 attention is also the more accurate one. On a GPU the
16-bit kernels win and auto keeps the autocast dtype without timing.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from currytrain.model.layers import Attention

FP32_MARGIN = 0.85
"""auto runs the attention in fp32 only when that takes at most this share of the autocast dtype's time: near the
crossover the two are alike, and a margin keeps the choice from flipping with the machine's noise."""


@dataclass(frozen=True)
class AttentionChoice:
    """What trainer.attention_precision chose (the journal's `attention_precision` event)."""

    fp32: bool
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def event(self) -> dict[str, Any]:
        return {"fp32": self.fp32, "reason": self.reason, **self.numbers}

    def apply(self, model: torch.nn.Module) -> AttentionChoice:
        """Set the model's SDPA attention modules to this choice; returns it."""
        for module in sdpa_attentions(model):
            module.attention_fp32 = self.fp32
        return self


def sdpa_attentions(model: torch.nn.Module) -> list[Attention]:
    """The model's attention modules that run torch's SDPA (not a soft-capped or ring attention of their own)."""
    return [module for module in model.modules() if isinstance(module, Attention) and module.core is None]


def choose_attention_precision(
    model: torch.nn.Module, setting: str, autocast_dtype: torch.dtype | None, device: torch.device, batch: int, seq_len: int | None, world_size: int
) -> AttentionChoice | None:
    """Set the attention modules' dtype for `setting` and say why; None where there is nothing to choose (no
    16-bit autocast, or no SDPA attention in the model) or nothing to time it at (auto, a data adapter that states
    no seq_len)."""
    attentions = sdpa_attentions(model)
    if autocast_dtype is None or not attentions or setting == "autocast" or (setting == "auto" and seq_len is None):
        return None
    if setting == "fp32":
        choice = AttentionChoice(True, "trainer.attention_precision=fp32")
    elif device.type != "cpu":
        choice = AttentionChoice(False, f"on {device.type} the {_name(autocast_dtype)} attention kernels are the fast ones")
    elif world_size > 1:
        choice = AttentionChoice(False, "auto times the kernels on one process only: pass trainer.attention_precision=fp32 to run it in fp32")
    else:
        shapes = {_shape(module, batch, seq_len) for module in attentions}
        low, fp32 = (sum(attention_seconds(shape, dtype) for shape in shapes) for dtype in (autocast_dtype, torch.float32))
        faster = fp32 <= FP32_MARGIN * low
        reason = (
            f"forward + backward of the attention at the run's shapes takes {low * 1e3:.2f} ms in {_name(autocast_dtype)} and {fp32 * 1e3:.2f} ms "
            f"in fp32 (fp32 is taken where it needs at most {FP32_MARGIN:.0%} of the other's time)"
        )
        numbers = {"autocast_ms": round(low * 1e3, 3), "fp32_ms": round(fp32 * 1e3, 3), "shapes": [list(shape) for shape in sorted(shapes)]}
        choice = AttentionChoice(faster, reason, numbers)
    return choice.apply(model)


def _name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def _shape(module: Attention, batch: int, seq_len: int) -> tuple[int, ...]:
    """(batch, query heads, kv heads, seq_len, query/key width, value width) of one attention call."""
    return (batch, module.n_heads, module.n_kv_heads, seq_len, module.head_dim, getattr(module, "v_head_dim", module.head_dim))


@functools.cache
def attention_seconds(shape: tuple[int, ...], dtype: torch.dtype, calls: int = 3) -> float:
    """The fastest of `calls` forward + backward passes of causal SDPA on the CPU at `shape` (after one warm-up)."""
    batch, heads, kv_heads, seq_len, width, value_width = shape
    q = torch.randn(batch, heads, seq_len, width, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, kv_heads, seq_len, width, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, kv_heads, seq_len, value_width, dtype=dtype, requires_grad=True)
    grad = torch.randn(batch, heads, seq_len, value_width, dtype=dtype)
    best = float("inf")
    with torch.enable_grad():
        for call in range(calls + 1):
            started = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads).backward(grad)
            if call:
                best = min(best, time.perf_counter() - started)
    return best
