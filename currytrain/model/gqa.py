"""The Llama-style GQA decoder. Architecture only: parallelism and checkpointing are applied from outside."""

from __future__ import annotations

import math

import torch
from torch import nn

from currytrain.model.layers import Attention, RMSNorm, SwiGLU, build_rope_cache


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(
        self, dim: int, n_heads: int, n_kv_heads: int, mlp_hidden: int, norm_eps: float, qkv_bias: bool = False, qk_norm: bool = False
    ):
        super().__init__()
        self.attention_norm = RMSNorm(dim, norm_eps)
        self.attention = Attention(dim, n_heads, n_kv_heads, qkv_bias=qkv_bias, qk_norm=qk_norm, norm_eps=norm_eps)
        self.mlp_norm = RMSNorm(dim, norm_eps)
        self.mlp = SwiGLU(dim, mlp_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class GQATransformer(nn.Module):
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab_size)."""

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
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.init_std = init_std
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(
            Block(dim, n_heads, n_kv_heads, mlp_hidden, norm_eps, qkv_bias=qkv_bias, qk_norm=qk_norm) for _ in range(n_layers)
        )
        self.norm = RMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = build_rope_cache(max_seq_len, dim // n_heads, rope_theta)
        # Non-persistent: derived from the config, so checkpoints and HF exports carry only weights.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.init_std)
                if getattr(module, "bias", None) is not None:  # qkv_bias
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                module.reset_parameters()
        # Projections that write into the residual stream are scaled down with depth (GPT-2), so
        # the stream's variance at init does not grow with n_layers.
        residual_std = self.init_std / math.sqrt(2 * len(self.layers))
        for block in self.layers:
            nn.init.normal_(block.attention.wo.weight, std=residual_std)
            nn.init.normal_(block.mlp.w2.weight, std=residual_std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.rope_cos, self.rope_sin)
        return self.output(self.norm(h))
