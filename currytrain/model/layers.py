"""Building blocks shared by the decoder families: RMSNorm, rotary embedding, attention (grouped-query and
multi-head latent), the gated MLP, and the residual blocks that arrange them (pre-, sandwich- or post-norm).

Variants are chosen when a module is built (a subclass, a function stored on the module), so a model that
uses none of them runs exactly the code it ran before they existed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from currytrain.model.cache import LayerCache


class RMSNorm(nn.Module):
    """Root-mean-square norm: rescale by 1/rms(x), no mean subtraction, learned gain."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype:  # torch's fused kernel: the same numbers, a quarter faster on the CPU
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # Normalise in fp32 so bf16 activations do not lose the small-variance tail.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class OffsetRMSNorm(RMSNorm):
    """RMSNorm whose gain is 1 + weight, computed in fp32 (Gemma): a weight of 0 is the identity gain."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)


def norm_class(unit_offset: bool) -> type[RMSNorm]:
    """The RMSNorm of model.norm_unit_offset: gain 1 + weight (Gemma) or weight."""
    return OffsetRMSNorm if unit_offset else RMSNorm


class ScaledEmbedding(nn.Embedding):
    """Token embedding multiplied by a constant (Gemma: sqrt(dim), rounded to fp32 as its checkpoints expect)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, scale: float):
        super().__init__(num_embeddings, embedding_dim)
        self.scale = torch.tensor(scale, dtype=torch.float32, device="cpu").item()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens) * self.scale


class SoftcappedLinear(nn.Linear):
    """A linear readout whose outputs are soft-capped: cap * tanh(y / cap) (Gemma 2's final logits)."""

    def __init__(self, in_features: int, out_features: int, cap: float, bias: bool = False):
        super().__init__(in_features, out_features, bias=bias)
        self.cap = cap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(super().forward(x) / self.cap) * self.cap


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
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()

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
        if self.kind == "longrope":  # LongRoPE (Phi-3): a searched factor per pair; short ones up to the original context
            return inv_freq / torch.tensor(self.short_factor, dtype=inv_freq.dtype, device=inv_freq.device)
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

    def long(self) -> RopeScaling:
        """LongRoPE's scaling for inputs longer than original_max_seq_len: the long factors in place of the short."""
        return dataclasses.replace(self, short_factor=self.long_factor)

    @property
    def magnitude(self) -> float:
        """What cos and sin are multiplied by: YaRN's attention temperature (attention_factor, or
        0.1 ln(factor) + 1 when it is 0), LongRoPE's (attention_factor, or sqrt(1 + ln(factor) / ln(original
        context))); 1 for the other kinds."""
        if self.kind not in ("yarn", "longrope"):
            return 1.0
        if self.attention_factor > 0:
            return self.attention_factor
        if self.factor <= 1:
            return 1.0
        if self.kind == "longrope":
            return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_seq_len))
        return 0.1 * math.log(self.factor) + 1.0


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
    if cos.dim() == 2:  # a table by position; per-token angles (batch, 1, seq, half) come gathered already
        seq_len = x.shape[-2]
        cos, sin = cos[:seq_len], sin[:seq_len]
    x32 = x.float()
    # (first * cos - second * sin, second * cos + first * sin), the same numbers in three kernels over x, with the
    # halves swapped by one roll and the sign in the (small) sine table: 1.2-1.3x faster forward + backward than
    # negating and concatenating the halves (docs/performance.md).
    swapped = x32.roll(x.shape[-1] // 2, dims=-1)
    rotated = x32 * torch.cat((cos, cos), dim=-1) + swapped * torch.cat((-sin, sin), dim=-1)
    return rotated.type_as(x)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first 2 * cos.shape[-1] channels of each head (rotate-half among them); keep the others as they are."""
    rotated = 2 * cos.shape[-1]
    return torch.cat((apply_rope(x[..., :rotated], cos, sin), x[..., rotated:]), dim=-1)


def window_mask(seq_len: int, window: int | None, device: torch.device, num_keys: int | None = None) -> torch.Tensor:
    """(queries, keys) True where a query may attend a key: causal, and 0 <= i - j < window when a window is given.
    The seq_len queries are the last positions of num_keys keys (default seq_len): a KV cache's new tokens."""
    num_keys = seq_len if num_keys is None else num_keys
    offset = torch.arange(num_keys - seq_len, num_keys, device=device)[:, None] - torch.arange(num_keys, device=device)[None, :]
    return (offset >= 0) & (offset < window) if window else offset >= 0


def softcapped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, *, softcap: float, window: int | None, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Causal attention whose scores are soft-capped, cap * tanh(scores / cap), before the mask and the softmax
    (Gemma 2). Written out, since the fused kernels cannot cap; q, k, v have the same number of heads (k and v may
    hold earlier positions than q: a KV cache's). mask: a further (batch, 1, seq, seq) mask, True where a query may
    attend a key (documents)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    allowed = window_mask(q.shape[-2], window, q.device, k.shape[-2])
    scores = scores.masked_fill(~(allowed if mask is None else allowed & mask), float("-inf"))
    return torch.matmul(scores.softmax(dim=-1, dtype=torch.float32).to(v.dtype), v)


class Attention(nn.Module):
    """Causal grouped-query attention: n_kv_heads key/value heads shared by groups of query heads.

    Optional variants (all off by default, adding no parameters): qkv_bias gives the q/k/v projections a
    bias (Qwen2), qk_norm RMS-normalises each query and key head before RoPE (Qwen3, Gemma 3; a whole
    projection at once: ProjectionNormAttention). softmax_scale multiplies q.k before the softmax; None is
    the usual 1/sqrt(head_dim). head_dim: the width of each head, None for dim // n_heads. sliding_window:
    each query sees itself and the sliding_window - 1 keys before it; None sees the whole causal context.
    rope_dim: RoPE rotates only the first rope_dim channels of each head (0: all). softcap: scores are
    soft-capped (Gemma 2), through a written-out attention set as `core`. norm: the RMSNorm class of qk_norm.
    """

    per_head_norm = True
    """qk_norm normalises each head alone (a gain of head_dim); ProjectionNormAttention normalises all of them."""
    attention_fp32 = False
    """Under a 16-bit autocast, run the attention kernel in fp32 while gradients are on (trainer.attention_precision:
    on the CPU, SDPA's fp32 backward beats its bf16 one at short sequences; currytrain/parallel/kernels.py)."""

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
        *,
        rope_dim: int = 0,
        softcap: float = 0.0,
        norm: type[RMSNorm] = RMSNorm,
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
        q_width, k_width = (self.head_dim, self.head_dim) if self.per_head_norm else (n_heads * self.head_dim, n_kv_heads * self.head_dim)
        self.q_norm = norm(q_width, norm_eps) if qk_norm else None
        self.k_norm = norm(k_width, norm_eps) if qk_norm else None
        self.rotate = rope_function(rope_dim, self.head_dim)
        self.core: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float | None], torch.Tensor] | None = (
            functools.partial(softcapped_attention, softcap=softcap, window=sliding_window) if softcap else None
        )
        """Causal attention of (q, k, v, scale) in place of SDPA, on k/v expanded to every head: the soft-capped
        attention, or set from outside (context parallelism's ring)."""

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of x (batch, seq, dim), heads first: (batch, heads, seq, head width), q and k normalised."""
        batch, seq_len, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_heads / tp of them (and as many kv heads per group).
        q, k, v = (y.view(batch, seq_len, -1, self.head_dim).transpose(1, 2) for y in shared_input_linears(x, self.wq, self.wk, self.wv))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """cos, sin: the RoPE tables from x's first position on (or gathered per token: (batch, 1, seq, half)). cache:
        generation's keys and values of the earlier positions (model/cache.py); x's are added to it and its queries
        attend to all of them. mask: None for causal attention, or (batch, 1, seq, seq), True where a query may
        attend a key: causal within each document (the decoder's document boundaries)."""
        batch, seq_len, _ = x.shape
        q, k, v = self.project(x)
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v)
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
            out = self.core(q, k, v, self.softmax_scale) if mask is None else self.core(q, k, v, self.softmax_scale, mask=mask)
        elif self.attention_fp32 and q.dtype != torch.float32 and torch.is_grad_enabled():
            with torch.autocast(q.device.type, enabled=False):
                out = self.sdpa(q.float(), k.float(), v.float(), gqa, mask)
        else:
            out = self.sdpa(q, k, v, gqa, mask)
        return self.wo(out.transpose(1, 2).reshape(batch, seq_len, -1))

    def sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Torch's fused causal attention (SDPA), within the sliding window when the sequence is longer than it, and
        within `mask` (documents) when one is given. Keys beyond the queries (a KV cache's earlier positions) come
        first: the queries are the last positions."""
        seq_len, num_keys = q.shape[-2], k.shape[-2]
        if num_keys > seq_len:
            if seq_len == 1 and not (self.sliding_window and num_keys > self.sliding_window):  # one query sees every key
                return F.scaled_dot_product_attention(q, k, v, scale=self.softmax_scale, enable_gqa=gqa)
            mask = window_mask(seq_len, self.sliding_window, q.device, num_keys)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.softmax_scale, enable_gqa=gqa)
        windowed = bool(self.sliding_window and seq_len > self.sliding_window)
        if windowed or mask is not None:
            allowed = window_mask(seq_len, self.sliding_window if windowed else None, q.device)
            allowed = allowed if mask is None else allowed & mask
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.softmax_scale, enable_gqa=gqa)
        # the window covers the sequence: plain causal attention keeps the fused kernels
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=gqa)


def _runs_as_matmul(linear: nn.Module) -> bool:
    """A plain nn.Linear whose call would do nothing but its matmul: no subclass (float8, adapters), no hooks
    (the ladder's and diagnose's probes), plain weights (not a tensor-parallel DTensor)."""
    return (
        type(linear) is nn.Linear
        and type(linear.weight) in (nn.Parameter, torch.Tensor)
        and not (linear._forward_hooks or linear._forward_pre_hooks or linear._backward_hooks or linear._backward_pre_hooks)
    )


def _global_module_hooks() -> bool:
    """Whether hooks are registered for every module (torch.nn.modules.module.register_module_forward_hook...)."""
    module = torch.nn.modules.module
    names = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks")
    return any(getattr(module, name, None) for name in names)


def shared_input_linears(x: torch.Tensor, *linears: nn.Module) -> Sequence[torch.Tensor]:
    """linear(x) for each of `linears`. Under a 16-bit autocast or torch.compile, as one matmul over their weights
    concatenated where x has at least as many rows (tokens) as they have outputs together: autocast then casts x
    once instead of once per linear, and on the CPU one bf16 matmul of the whole width beats several narrow ones (a
    small model's step: 5-9%); a compiled fp32 step makes one matmul where it made three, forward and backward
    (TINY 1.6%, small 1.9% a step). The concatenation copies the weights every step, which costs more than it saves
    where the weights outgrow the tokens (the ~125M model at 512 tokens a step: 2% slower). In eager fp32 (no faster
    there: docs/performance.md), and wherever a linear must run as its module (see _runs_as_matmul), each is called
    as it is."""
    widths = [linear.out_features for linear in linears]
    if (
        (torch.is_autocast_enabled(x.device.type) or torch.compiler.is_compiling())
        and x.numel() // x.shape[-1] >= sum(widths)
        and all(map(_runs_as_matmul, linears))
        and len({linear.bias is None for linear in linears}) == 1
        and not _global_module_hooks()
    ):
        weight = torch.cat([linear.weight for linear in linears])
        bias = None if linears[0].bias is None else torch.cat([linear.bias for linear in linears])
        return F.linear(x, weight, bias).split(widths, dim=-1)
    return [linear(x) for linear in linears]


def rope_function(rope_dim: int, head_dim: int) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """apply_rope when RoPE turns the whole head, apply_partial_rope when only its first rope_dim channels."""
    return apply_partial_rope if 0 < rope_dim < head_dim else apply_rope


class ProjectionNormAttention(Attention):
    """Attention whose qk_norm normalises the whole query and key projections (all heads together, a gain per
    channel) before they are split into heads (OLMo 2)."""

    per_head_norm = False

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, seq_len, _ = x.shape
        q = self.q_norm(self.wq(x)).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        k = self.k_norm(self.wk(x)).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        return q, k, v


class LatentAttention(Attention):
    """Multi-head latent attention (DeepSeek-V2/V3): each token's keys and values are expanded per head from one
    RMS-normalised latent of kv_lora_rank channels, and one RoPE key of rope_dim channels is shared by every head.
    Queries come straight from x, or through a normalised latent of q_lora_rank channels when that is > 0.

    Each query/key head is head_dim wide: rope_dim rotated channels first, then head_dim - rope_dim unrotated
    ones; the projections keep transformers' order (unrotated first) and project() puts the rotated part first.
    Value heads are v_head_dim wide (0: head_dim).
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        rope_dim: int,
        kv_lora_rank: int,
        q_lora_rank: int = 0,
        v_head_dim: int = 0,
        norm_eps: float = 1e-5,
        softmax_scale: float | None = None,
        sliding_window: int | None = None,
        norm: type[RMSNorm] = RMSNorm,
    ):
        nn.Module.__init__(self)
        assert 0 < rope_dim < head_dim and kv_lora_rank > 0
        self.n_heads = self.n_kv_heads = n_heads
        self.head_dim = head_dim
        self.rope_dim = rope_dim
        self.v_head_dim = v_head_dim or head_dim
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        self.softmax_scale = softmax_scale
        self.sliding_window = sliding_window
        if q_lora_rank:
            self.wq_a = nn.Linear(dim, q_lora_rank, bias=False)
            self.q_a_norm = norm(q_lora_rank, norm_eps)
            self.wq_b = nn.Linear(q_lora_rank, n_heads * head_dim, bias=False)
        else:
            self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wkv_a = nn.Linear(dim, kv_lora_rank + rope_dim, bias=False)
        self.kv_a_norm = norm(kv_lora_rank, norm_eps)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (head_dim - rope_dim + self.v_head_dim), bias=False)
        self.wo = nn.Linear(n_heads * self.v_head_dim, dim, bias=False)
        self.rotate = apply_partial_rope
        self.core = None

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, seq_len, _ = x.shape
        plain = self.head_dim - self.rope_dim
        queries = self.wq_b(self.q_a_norm(self.wq_a(x))) if self.q_lora_rank else self.wq(x)
        q_plain, q_rope = queries.view(batch, seq_len, -1, self.head_dim).transpose(1, 2).split([plain, self.rope_dim], dim=-1)
        latent, k_rope = self.wkv_a(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        kv = self.wkv_b(self.kv_a_norm(latent)).view(batch, seq_len, -1, plain + self.v_head_dim).transpose(1, 2)
        k_plain, v = kv.split([plain, self.v_head_dim], dim=-1)
        k_rope = k_rope.view(batch, 1, seq_len, self.rope_dim).expand(-1, k_plain.shape[1], -1, -1)
        return torch.cat((q_rope, q_plain), dim=-1), torch.cat((k_rope, k_plain), dim=-1), v


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
}
"""The gate activations of model.mlp_activation."""


class SwiGLU(nn.Module):
    """Gated MLP: w2(act(w1 x) * w3 x), act silu (SwiGLU) by default, or a GELU (GeGLU: model.mlp_activation)."""

    def __init__(self, dim: int, hidden_dim: int, activation: str = "silu"):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = shared_input_linears(x, self.w1, self.w3)
        return self.w2(self.act(gate) * up)

    def residual_projections(self) -> tuple[nn.Linear, ...]:
        """The linear that writes into the residual stream."""
        return (self.w2,)


class Block(nn.Module):
    """Pre-norm residual block (Llama): x + attention(attention_norm(x)), then x + mlp(mlp_norm(x)).

    attention: the block's attention, called as attention(h, cos, sin), with cache=cache when decoding and mask=mask
    when the documents' mask is asked for (by keyword: tensor parallelism's input plan lays out three positional
    inputs; an attention written without either still trains); mlp: its feed-forward module (a SwiGLU,
    an MoE), registered as `mlp_name` so that checkpoints keep each family's names; norm(): a new RMSNorm of the
    residual width. SandwichBlock and PostNormBlock place the norms elsewhere (model.norm_position).
    """

    pre_norm, post_norm = True, False

    def __init__(self, attention: nn.Module, mlp: nn.Module, norm: Callable[[], nn.Module], mlp_name: str = "mlp"):
        super().__init__()
        # Registration order is init order (Decoder.reset_parameters walks the modules): keep it the residual order.
        if self.pre_norm:
            self.attention_norm = norm()
        self.attention = attention
        if self.post_norm:
            self.post_attention_norm = norm()
        if self.pre_norm:
            self.mlp_norm = norm()
        self.add_module(mlp_name, mlp)
        if self.post_norm:
            self.post_mlp_norm = norm()
        self.mlp_name = mlp_name

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attend(self.attention_norm(x), cos, sin, cache, mask)
        return x + self._modules[self.mlp_name](self.mlp_norm(x))

    def attend(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The attention sublayer; the cache and the documents' mask are passed only when there is one."""
        if mask is not None:
            return self.attention(h, cos, sin, cache=cache, mask=mask)
        return self.attention(h, cos, sin) if cache is None else self.attention(h, cos, sin, cache=cache)

    def residual_projections(self) -> tuple[nn.Linear, ...]:
        """The linears that write into the residual stream (scaled down with depth at init)."""
        return (self.attention.wo, *self._modules[self.mlp_name].residual_projections())


class SandwichBlock(Block):
    """Norms before and after each sublayer (Gemma 2/3): x + post_norm(f(norm(x))) for attention, then the MLP."""

    pre_norm, post_norm = True, True

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.post_attention_norm(self.attend(self.attention_norm(x), cos, sin, cache, mask))
        return x + self.post_mlp_norm(self._modules[self.mlp_name](self.mlp_norm(x)))


class PostNormBlock(Block):
    """Norms after each sublayer, on its output only (OLMo 2): x + post_norm(f(x)) for attention, then the MLP."""

    pre_norm, post_norm = False, True

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.post_attention_norm(self.attend(x, cos, sin, cache, mask))
        return x + self.post_mlp_norm(self._modules[self.mlp_name](x))


BLOCKS: dict[str, type[Block]] = {"pre": Block, "sandwich": SandwichBlock, "post": PostNormBlock}
"""The block class of each model.norm_position."""
