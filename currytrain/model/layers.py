"""Building blocks shared by the decoder families: RMSNorm, rotary embedding, GQA attention, SwiGLU."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm: rescale by 1/rms(x), no mean subtraction, learned gain."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 so bf16 activations do not lose the small-variance tail.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


@dataclass(frozen=True)
class RopeScaling:
    """How the RoPE frequencies are rescaled for a longer context (the rope_* fields of RopeDecoderConfig)."""

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_seq_len: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 0.0
    truncate: bool = True

    def apply(self, inv_freq: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
        """The scaled inverse frequencies (radians per token) of each channel pair (theta: the RoPE base)."""
        if self.kind == "none":
            return inv_freq
        if self.kind == "linear":  # position interpolation: position p is rotated like p / factor
            return inv_freq / self.factor
        if self.kind == "yarn":
            return self._yarn(inv_freq, theta)
        if self.kind == "dynamic":  # unscaled up to original_max_seq_len; longer inputs rescale theta (dynamic_theta)
            return inv_freq
        assert self.kind == "llama3", self.kind
        # Llama 3.1: wavelengths longer than the pretraining context / low_freq_factor are stretched by factor,
        # those shorter than context / high_freq_factor kept, and a linear ramp in context/wavelength between.
        wavelen = 2 * math.pi / inv_freq
        ramp = (self.original_max_seq_len / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        ramp = ramp.clamp(0.0, 1.0)
        return (1 - ramp) * inv_freq / self.factor + ramp * inv_freq

    def _yarn(self, inv_freq: torch.Tensor, theta: float) -> torch.Tensor:
        """YaRN (Peng et al., 2023): channel pairs that turn more than beta_fast times over the pretraining
        context keep their frequency, those turning fewer than beta_slow times are interpolated by factor,
        with a linear ramp in the pair index between."""
        head_dim = 2 * len(inv_freq)

        def pair_turning(rotations: float) -> float:  # the pair index that turns `rotations` times over the context
            return head_dim * math.log(self.original_max_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        low, high = pair_turning(self.beta_fast), pair_turning(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        high = high + 0.001 if low == high else high  # a one-pair ramp would divide by zero
        kept = 1 - ((torch.arange(len(inv_freq), dtype=torch.float32, device=inv_freq.device) - low) / (high - low)).clamp(0.0, 1.0)
        return inv_freq / self.factor * (1 - kept) + inv_freq * kept

    def dynamic_theta(self, theta: float, seq_len: int, head_dim: int) -> float:
        """Dynamic NTK scaling: a sequence longer than original_max_seq_len rotates every position with a base
        raised so the longest wavelength stretches with it; shorter ones keep theta."""
        if seq_len <= self.original_max_seq_len:
            return theta
        growth = self.factor * seq_len / self.original_max_seq_len - (self.factor - 1)
        return theta * growth ** (head_dim / (head_dim - 2))

    @property
    def magnitude(self) -> float:
        """What cos and sin are multiplied by: YaRN's attention temperature (attention_factor, or
        0.1 ln(factor) + 1 when it is 0); 1 for the other kinds."""
        if self.kind != "yarn":
            return 1.0
        if self.attention_factor > 0:
            return self.attention_factor
        return 0.1 * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0


def build_rope_cache(seq_len: int, head_dim: int, theta: float, device=None, scaling: RopeScaling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (seq_len, head_dim // 2) for rotary position embedding."""
    assert head_dim % 2 == 0, "RoPE needs an even head dimension"
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if scaling is not None:
        inv_freq = scaling.apply(inv_freq, theta)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    magnitude = scaling.magnitude if scaling is not None else 1.0
    if magnitude != 1.0:  # YaRN scales q.k by magnitude**2 through the rotation itself
        return angles.cos() * magnitude, angles.sin() * magnitude
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (batch, heads, seq, head_dim) by position-dependent angles.

    Channel i is paired with channel i + head_dim/2 (the "rotate half" layout of GPT-NeoX and
    HF transformers), so Llama-family checkpoints map onto this module without permuting rows.
    """
    seq_len = x.shape[-2]
    cos, sin = cos[:seq_len], sin[:seq_len]
    x32 = x.float()
    first, second = x32.chunk(2, dim=-1)
    rotated = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    return rotated.type_as(x)


class Attention(nn.Module):
    """Causal grouped-query attention: n_kv_heads key/value heads shared by groups of query heads.

    Two optional variants (both off by default, adding no parameters): qkv_bias gives the q/k/v
    projections a bias (Qwen2), qk_norm RMS-normalises each query and key head before RoPE (Qwen3).
    softmax_scale multiplies q.k before the softmax; None is the usual 1/sqrt(head_dim) (muP passes its own).
    head_dim: the width of each head, None for dim // n_heads. sliding_window: each query sees itself and
    the sliding_window - 1 keys before it; None sees the whole causal context.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        norm_eps: float = 1e-5,
        softmax_scale: float | None = None,
        head_dim: int | None = None,
        sliding_window: int | None = None,
    ):
        super().__init__()
        assert (head_dim or dim % n_heads == 0) and n_heads % n_kv_heads == 0
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim or dim // n_heads
        self.softmax_scale = softmax_scale
        self.sliding_window = sliding_window
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=qkv_bias)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=qkv_bias)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim, norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, norm_eps) if qk_norm else None
        self.core: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float | None], torch.Tensor] | None = None
        """Causal attention of (q, k, v, scale) in place of SDPA; set from outside (context parallelism's ring)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_heads / tp of them (and as many kv heads per group).
        q = self.wq(x).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Grouped kv heads: SDPA's enable_gqa where its kernel for this input takes them (CPU; flash attention on
        # a GPU, which needs 16-bit inputs), else k/v expanded to every head: on a GPU in fp32 the efficient and
        # cuDNN kernels refuse enable_gqa and SDPA would fall back to the slow math one. The ring attention of
        # context parallelism takes expanded heads.
        grouped = self.n_kv_heads != self.n_heads
        gqa = grouped and self.core is None and (q.device.type == "cpu" or q.dtype in (torch.float16, torch.bfloat16))
        if grouped and not gqa:
            groups = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        if self.core is not None:
            out = self.core(q, k, v, self.softmax_scale)
        elif self.sliding_window and seq_len > self.sliding_window:
            mask = self._window_mask(seq_len, x.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.softmax_scale, enable_gqa=gqa)
        else:  # the window covers the sequence: plain causal attention keeps the fused kernels
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=gqa)
        return self.wo(out.transpose(1, 2).reshape(batch, seq_len, -1))

    def _window_mask(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """(seq, seq) True where query i may attend key j: 0 <= i - j < sliding_window."""
        offset = torch.arange(seq_len, device=device)[:, None] - torch.arange(seq_len, device=device)[None, :]
        return (offset >= 0) & (offset < self.sliding_window)


class SwiGLU(nn.Module):
    """Gated MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
