"""Decoder: the scaffolding every decoder family shares around its blocks.

Token embedding -> `layers` (an nn.ModuleList of blocks) -> final RMSNorm -> output projection, with
optional embedding tying and RoPE tables; the init (normal weights, GPT-2 depth scaling of residual
writes); and muP (hidden-matrix init and learning rates, the readout's 1/width). A family subclasses
Decoder, passes a function that builds one of its blocks, and adds only what is particular to it.

Each block implements residual_projections(): the linear layers that write into the residual stream.
RopeDecoder adds the attention blocks of the RoPE families (gqa, moe): the RopeDecoderConfig fields, each
chosen once when the model is built.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from currytrain.model.cache import KVCache
from currytrain.model.layers import (
    BLOCKS,
    Attention,
    LatentAttention,
    ProjectionNormAttention,
    RMSNorm,
    RopeScaling,
    ScaledEmbedding,
    SoftcappedLinear,
    build_rope_cache,
    norm_class,
)
from currytrain.model.protocol import HiddenMatrices


def mup_width_multiplier(dim: int, mup: bool, mup_base_width: int) -> float:
    """muP (Tensor Programs V) sizes everything by the width relative to the width hyperparameters were
    tuned at; 1.0 with mup off."""
    return dim / mup_base_width if mup else 1.0


def mup_attention_scale(head_dim: int, dim: int, mup: bool, mup_base_width: int) -> float | None:
    """The q.k multiplier under muP, or None (attention's usual 1/sqrt(head_dim)) with mup off.

    muP scores q.k by 1/head_dim (q and k become correlated during training, so their dot product grows
    like head_dim, not sqrt(head_dim)); the constant makes it 1/sqrt(head_dim) at the base width.
    """
    if not mup:
        return None
    return 1.0 / math.sqrt(head_dim * mup_width_multiplier(dim, mup, mup_base_width))


def rope_scaling_of(kind: str, factor: float, low_freq_factor: float, high_freq_factor: float, original_max_seq_len: int, **yarn: Any) -> RopeScaling | None:
    """The RopeScaling the rope_* config fields describe, None when unscaled; `yarn`: beta_fast, beta_slow,
    attention_factor, truncate (used by kind=yarn only)."""
    if kind == "none":
        return None
    return RopeScaling(kind, factor, low_freq_factor, high_freq_factor, original_max_seq_len, **yarn)


class Decoder(nn.Module):
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab_size) through the blocks in `layers`.

    The arguments before build_block are the DecoderConfig fields of the same names.
    build_block: makes one block; called n_layers times, between building the embedding and the final
    norm, so that the draws of the modules' default init stay in module order (and seeds reproduce).
    rope_head_dim: with a head size, builds the RoPE tables rope_cos/rope_sin and forward runs each block
    as block(h, rope_cos, rope_sin). A family without RoPE leaves it None and overrides forward.
    rope_scaling: how the RoPE frequencies are rescaled (None: unscaled).
    rope_local_theta, layer_rope: with a theta > 0, a second, unscaled table of that base (rope_cos_local) for
    the layers whose layer_rope entry is 1 (Gemma 3's sliding layers); the others use the first.
    norm: the RMSNorm class of the final norm (norm_class). embed_scale: > 0 multiplies the token embeddings
    (Gemma: sqrt(dim)). logit_softcap: > 0 soft-caps the logits, cap * tanh(logits / cap).
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        n_layers: int,
        max_seq_len: int,
        norm_eps: float,
        tie_embeddings: bool,
        init_std: float,
        mup: bool,
        mup_base_width: int,
        *,
        build_block: Callable[[], nn.Module],
        rope_head_dim: int | None = None,
        rope_theta: float = 10000.0,
        rope_scaling: RopeScaling | None = None,
        rope_local_theta: float = 0.0,
        layer_rope: Sequence[int] = (),
        norm: type[RMSNorm] = RMSNorm,
        embed_scale: float = 0.0,
        logit_softcap: float = 0.0,
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.init_std = init_std
        self.mup = mup
        self.width_multiplier = mup_width_multiplier(dim, mup, mup_base_width)
        self.tok_embeddings = ScaledEmbedding(vocab_size, dim, embed_scale) if embed_scale > 0 else nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(build_block() for _ in range(n_layers))
        self.norm = norm(dim, norm_eps)
        self.output = SoftcappedLinear(dim, vocab_size, logit_softcap) if logit_softcap > 0 else nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.documents: tuple[int, bool, bool] | None = None
        """(boundary token, restart positions, mask attention) when the data packs documents and asks the model to
        respect them (RopeDecoder.use_document_boundaries); None: positions and attention run across the window."""
        self.layer_rope = tuple(layer_rope) or (0,) * n_layers
        """Which RoPE table of rope_tables() each layer rotates with (1: the local one)."""
        # Beyond the original context, dynamic scaling rebuilds the tables in forward; LongRoPE switches to its long ones.
        beyond = rope_scaling is not None and rope_scaling.kind in ("dynamic", "longrope")
        self.rope_dynamic = (rope_head_dim, rope_theta, rope_scaling) if beyond else None
        self.rope_local = rope_local_theta > 0
        if rope_head_dim is not None:
            self._register_rope("", build_rope_cache(max_seq_len, rope_head_dim, rope_theta, device="cpu", scaling=rope_scaling))
            if beyond and rope_scaling.kind == "longrope":
                self._register_rope("_long", build_rope_cache(max_seq_len, rope_head_dim, rope_theta, device="cpu", scaling=rope_scaling.long()))
            if self.rope_local:
                self._register_rope("_local", build_rope_cache(max_seq_len, rope_head_dim, rope_local_theta, device="cpu"))
        self.reset_parameters()

    def _register_rope(self, suffix: str, tables: tuple[torch.Tensor, torch.Tensor]) -> None:
        """rope_cos<suffix> and rope_sin<suffix>: tables computed on the CPU, then placed. On the meta device (a model
        built for its shapes) torch would run the float arange through its Python reference kernels, whose first call
        imports torch._dynamo (0.7 s). Non-persistent: derived from the config, so checkpoints and HF exports carry
        only weights."""
        device = torch.get_default_device()
        self.register_buffer("rope_cos" + suffix, tables[0].to(device), persistent=False)
        self.register_buffer("rope_sin" + suffix, tables[1].to(device), persistent=False)

    def _hidden_matrices(self) -> list[nn.Parameter]:
        """muP's hidden matrices: the weight of every linear layer inside the blocks (attention and MLP
        projections), whose fan-in and fan-out both grow with dim. A family with other such weights adds them."""
        return [module.weight for block in self.layers for module in block.modules() if isinstance(module, nn.Linear)]

    def _reset_other(self, module: nn.Module, hidden_std: float, residual_std: float) -> None:
        """Initialise a module that holds weights of its own but is no Linear, Embedding or RMSNorm (MoE's stacked
        experts), at its place in module order; nothing by default."""

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal init of every weight, in module order: the order fixes which random draws each weight gets."""
        hidden = {id(weight) for weight in self._hidden_matrices()}
        # muP: a hidden matrix's std goes as 1/sqrt(fan_in), relative to the base width (1.0 with mup off).
        hidden_scale = 1.0 / math.sqrt(self.width_multiplier)
        hidden_std = self.init_std * hidden_scale
        # Projections that write into the residual stream are scaled down with depth (GPT-2), so
        # the stream's variance at init does not grow with n_layers.
        residual_std = self.init_std / math.sqrt(2 * len(self.layers)) * hidden_scale
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=hidden_std if id(module.weight) in hidden else self.init_std)
                if getattr(module, "bias", None) is not None:  # gqa's qkv_bias
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                module.reset_parameters()
            else:
                self._reset_other(module, hidden_std, residual_std)
        for block in self.layers:
            for linear in block.residual_projections():
                nn.init.normal_(linear.weight, std=residual_std)

    def mup_hidden_matrices(self) -> HiddenMatrices:
        """muP's hidden weights (trained with lr/width_multiplier under Adam); none with mup off.

        Embeddings, norm gains and the readout keep the base lr: the readout's 1/width is its logit multiplier.
        """
        if not self.mup:
            return HiddenMatrices(1.0, [])
        return HiddenMatrices(self.width_multiplier, self._hidden_matrices())

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """The residual stream h (..., dim) -> logits (..., vocab_size): final norm, output projection."""
        logits = self.output(self.norm(h))
        # muP readout: the output weights' Adam updates move logits by ~width, so logits carry 1/width_multiplier.
        return logits / self.width_multiplier if self.mup else logits

    def rope_tables(self, seq_len: int) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """The (cos, sin) tables for an input of seq_len tokens, indexed by layer_rope: the cached ones (then the
        local ones, with rope_local_theta). Beyond the original context, dynamic scaling uses tables whose base
        follows seq_len and LongRoPE its long factors (every position of the input uses them)."""
        tables = (self.rope_cos, self.rope_sin)
        if self.rope_dynamic is not None and seq_len > self.rope_dynamic[2].original_max_seq_len:
            head_dim, theta, scaling = self.rope_dynamic
            if scaling.kind == "longrope":
                tables = (self.rope_cos_long, self.rope_sin_long)
            else:
                tables = build_rope_cache(seq_len, head_dim, scaling.dynamic_theta(theta, seq_len, head_dim), device=self.rope_cos.device)
        return (tables, (self.rope_cos_local, self.rope_sin_local)) if self.rope_local else (tables,)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        tables = self.rope_tables(tokens.shape[1])
        mask = None
        if self.documents is not None:  # positions restart, and attention may stay, within each document
            positions, mask = document_layout(tokens, *self.documents)
            tables = tuple((cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)) for cos, sin in tables)
        for layer, table in zip(self.layers, self.layer_rope):
            h = layer(h, *tables[table]) if mask is None else layer(h, *tables[table], mask=mask)
        return self.readout(h)

    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (batch, new, vocab_size) of `tokens` (batch, new), the positions after the cache's, which
        attend to the cached keys and values and are added to them (generation: model/protocol.py HasKVCache).
        The RoPE tables are those of the whole sequence so far (dynamic scaling follows its length, as
        transformers' cached generation does), read from the new tokens' first position. LongRoPE rotates every
        position with its long factors once the sequence passes the original context: the keys cached with the short
        ones are computed again then (as transformers' Phi-3 generation does)."""
        start, new = cache.length, tokens.shape[1]
        if 0 < start and self._switches_rope(start, start + new):
            seen = cache.seen()
            cache.clear()
            return self.decode(torch.cat([seen, tokens], dim=1), cache)[:, start:]
        tables = self.rope_tables(start + new)
        if any(len(cos) < start + new for cos, _ in tables):
            raise ValueError(f"positions {start}-{start + new - 1} lie beyond the model's context of max_seq_len={self.max_seq_len} tokens")
        h = self.tok_embeddings(tokens)
        for index, (layer, table) in enumerate(zip(self.layers, self.layer_rope)):
            cos, sin = tables[table]
            h = layer(h, cos[start:], sin[start:], cache=cache.layer(index))
        cache.advance(tokens)
        return self.readout(h)

    def _switches_rope(self, before: int, after: int) -> bool:
        """Whether LongRoPE's tables change between sequences of `before` and `after` tokens."""
        if self.rope_dynamic is None or self.rope_dynamic[2].kind != "longrope":
            return False
        original = self.rope_dynamic[2].original_max_seq_len
        return before <= original < after


def document_layout(tokens: torch.Tensor, boundary: int, restart_positions: bool, masked: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The documents of a batch of windows of a packed stream, each ended by the token `boundary` (the EOS): the
    position of each token, (batch, seq), counted from its document's first token in the window (restart_positions;
    else from the window's), and with `masked` the (batch, 1, seq, seq) causal mask within documents."""
    seq_len = tokens.shape[1]
    index = torch.arange(seq_len, device=tokens.device).expand_as(tokens)
    starts = torch.zeros_like(tokens, dtype=torch.bool)
    starts[:, 1:] = tokens[:, :-1] == boundary  # a document starts after each boundary token
    if restart_positions:
        positions = index - torch.cummax(torch.where(starts, index, torch.zeros_like(index)), dim=1).values
    else:
        positions = index
    if not masked:
        return positions, None
    document = torch.cumsum(starts, dim=1)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=tokens.device).tril()
    return positions, ((document[:, :, None] == document[:, None, :]) & causal)[:, None]


def layer_kinds(n_layers: int, layer_types: Sequence[str], sliding_window: int) -> list[str]:
    """full or sliding for each layer: layer_types repeated over the layers, or every layer sliding when the
    window is set without a pattern (Mistral)."""
    if layer_types:
        return [layer_types[i % len(layer_types)] for i in range(n_layers)]
    return ["sliding" if sliding_window else "full"] * n_layers


class RopeDecoder(Decoder):
    """The decoder of the RoPE families (gqa, moe): blocks of attention and a feed-forward module, with the
    attention, norm and RoPE fields of RopeDecoderConfig (docs/model.md), each chosen here, once.

    The leading arguments are the DecoderConfig fields; the keyword ones after build_mlp the RopeDecoderConfig
    fields of the same names. build_mlp(i) -> (name, module): the feed-forward module of layer i and the name
    its weights live under (mlp, moe).
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        n_layers: int,
        n_heads: int,
        n_kv_heads: int,
        max_seq_len: int,
        *,
        build_mlp: Callable[[int], tuple[str, nn.Module]],
        rope_theta: float = 10000.0,
        norm_eps: float = 1e-5,
        tie_embeddings: bool = False,
        init_std: float = 0.02,
        mup: bool = False,
        mup_base_width: int = 128,
        head_dim: int = 0,
        rope_scaling: str = "none",
        rope_factor: float = 1.0,
        rope_low_freq_factor: float = 1.0,
        rope_high_freq_factor: float = 4.0,
        rope_original_max_seq_len: int = 8192,
        rope_beta_fast: float = 32.0,
        rope_beta_slow: float = 1.0,
        rope_attention_factor: float = 0.0,
        rope_truncate: bool = True,
        rope_short_factor: Sequence[float] = (),
        rope_long_factor: Sequence[float] = (),
        rope_local_theta: float = 0.0,
        rope_dim: int = 0,
        sliding_window: int = 0,
        layer_types: Sequence[str] = (),
        qkv_bias: bool = False,
        qk_norm: bool = False,
        qk_norm_scope: str = "head",
        norm_position: str = "pre",
        norm_unit_offset: bool = False,
        scale_embeddings: bool = False,
        attn_scale: float = 0.0,
        attn_softcap: float = 0.0,
        logit_softcap: float = 0.0,
        kv_lora_rank: int = 0,
        q_lora_rank: int = 0,
        v_head_dim: int = 0,
    ):
        head_dim = head_dim or dim // n_heads
        scaling = rope_scaling_of(
            rope_scaling,
            rope_factor,
            rope_low_freq_factor,
            rope_high_freq_factor,
            rope_original_max_seq_len,
            beta_fast=rope_beta_fast,
            beta_slow=rope_beta_slow,
            attention_factor=rope_attention_factor,
            truncate=rope_truncate,
            short_factor=tuple(rope_short_factor),
            long_factor=tuple(rope_long_factor),
        )
        softmax_scale = attn_scale if attn_scale > 0 else mup_attention_scale(head_dim, dim, mup, mup_base_width)
        norm = norm_class(norm_unit_offset)
        kinds = layer_kinds(n_layers, layer_types, sliding_window)
        layer_index = itertools.count()

        def build_attention(window: int | None) -> nn.Module:
            if kv_lora_rank > 0:
                return LatentAttention(dim, n_heads, head_dim, rope_dim, kv_lora_rank, q_lora_rank, v_head_dim, norm_eps, softmax_scale, window, norm=norm)
            attention = ProjectionNormAttention if qk_norm and qk_norm_scope == "projection" else Attention
            return attention(
                dim, n_heads, n_kv_heads, qkv_bias, qk_norm, norm_eps, softmax_scale, head_dim, window, rope_dim=rope_dim, softcap=attn_softcap, norm=norm
            )

        def build_block() -> nn.Module:
            i = next(layer_index)
            attention = build_attention(sliding_window if kinds[i] == "sliding" else None)
            mlp_name, mlp = build_mlp(i)
            return BLOCKS[norm_position](attention, mlp, lambda: norm(dim, norm_eps), mlp_name)

        super().__init__(
            vocab_size,
            dim,
            n_layers,
            max_seq_len,
            norm_eps,
            tie_embeddings,
            init_std,
            mup,
            mup_base_width,
            build_block=build_block,
            rope_head_dim=rope_dim or head_dim,
            rope_theta=rope_theta,
            rope_scaling=scaling,
            rope_local_theta=rope_local_theta,
            layer_rope=[int(kind == "sliding" and rope_local_theta > 0) for kind in kinds],
            norm=norm,
            embed_scale=math.sqrt(dim) if scale_embeddings else 0.0,
            logit_softcap=logit_softcap,
        )

    def use_document_boundaries(self, boundary: int, restart_positions: bool, masked: bool) -> None:
        """Respect the documents of packed windows, each ended by the token `boundary`: positions restart at each
        document's first token (restart_positions) and, with masked, attention does not cross a boundary. The data
        adapter asks for it (data.restart_positions, data.mask_documents); nothing of it is saved in checkpoints."""
        self.documents = (boundary, restart_positions, masked) if restart_positions or masked else None
