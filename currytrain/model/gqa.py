"""The Llama-style GQA decoder. Architecture only: parallelism and checkpointing are applied from outside."""

from __future__ import annotations

import torch
from torch import nn

from currytrain.model.decoder import Decoder, mup_attention_scale, rope_scaling_of
from currytrain.model.layers import Attention, RMSNorm, SwiGLU


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        mlp_hidden: int,
        norm_eps: float,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        attention_scale: float | None = None,
        head_dim: int | None = None,
        sliding_window: int | None = None,
    ):
        super().__init__()
        self.attention_norm = RMSNorm(dim, norm_eps)
        self.attention = Attention(
            dim,
            n_heads,
            n_kv_heads,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            norm_eps=norm_eps,
            softmax_scale=attention_scale,
            head_dim=head_dim,
            sliding_window=sliding_window,
        )
        self.mlp_norm = RMSNorm(dim, norm_eps)
        self.mlp = SwiGLU(dim, mlp_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))

    def residual_projections(self) -> tuple[nn.Linear, ...]:
        """The linears that write into the residual stream (scaled down with depth at init)."""
        return self.attention.wo, self.mlp.w2


class GQATransformer(Decoder):
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab_size): a Decoder of RoPE Blocks."""

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        n_layers: int,
        n_heads: int,
        n_kv_heads: int,
        mlp_hidden: int,
        max_seq_len: int,
        rope_theta: float = 10000.0,
        norm_eps: float = 1e-5,
        tie_embeddings: bool = False,
        init_std: float = 0.02,
        qkv_bias: bool = False,
        qk_norm: bool = False,
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
        sliding_window: int = 0,
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
        )
        attention_scale = mup_attention_scale(head_dim, dim, mup, mup_base_width)

        def build_block() -> Block:
            return Block(
                dim,
                n_heads,
                n_kv_heads,
                mlp_hidden,
                norm_eps,
                qkv_bias=qkv_bias,
                qk_norm=qk_norm,
                attention_scale=attention_scale,
                head_dim=head_dim,
                sliding_window=sliding_window or None,
            )

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
            rope_head_dim=head_dim,
            rope_theta=rope_theta,
            rope_scaling=scaling,
        )
