"""The Llama-style GQA decoder. Architecture only: parallelism and checkpointing are applied from outside."""

from __future__ import annotations

import math

import torch
from torch import nn

from currytrain.model.hooks import HiddenMatrices
from currytrain.model.layers import Attention, RMSNorm, SwiGLU, build_rope_cache


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
    ):
        super().__init__()
        self.attention_norm = RMSNorm(dim, norm_eps)
        self.attention = Attention(
            dim, n_heads, n_kv_heads, qkv_bias=qkv_bias, qk_norm=qk_norm, norm_eps=norm_eps, softmax_scale=attention_scale
        )
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
        mup: bool = False,
        mup_base_width: int = 128,
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.init_std = init_std
        self.mup = mup
        # muP (Tensor Programs V) sizes everything by the width relative to the width hyperparameters were tuned at.
        self.width_multiplier = dim / mup_base_width if mup else 1.0
        head_dim = dim // n_heads
        # muP scores q.k by 1/head_dim (q and k become correlated during training, so their dot product grows
        # like head_dim, not sqrt(head_dim)); the constant makes it 1/sqrt(head_dim) at the base width.
        attention_scale = 1.0 / math.sqrt(head_dim * self.width_multiplier) if mup else None
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(
            Block(dim, n_heads, n_kv_heads, mlp_hidden, norm_eps, qkv_bias=qkv_bias, qk_norm=qk_norm, attention_scale=attention_scale)
            for _ in range(n_layers)
        )
        self.norm = RMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = build_rope_cache(max_seq_len, head_dim, rope_theta)
        # Non-persistent: derived from the config, so checkpoints and HF exports carry only weights.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def _hidden_linears(self) -> list[nn.Linear]:
        """Every linear layer inside the blocks: attention and MLP projections, whose in and out widths both grow with dim."""
        return [module for block in self.layers for module in block.modules() if isinstance(module, nn.Linear)]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        hidden = {id(module) for module in self._hidden_linears()}
        # muP: a hidden matrix's std goes as 1/sqrt(fan_in), relative to the base width (1.0 with mup off).
        hidden_scale = 1.0 / math.sqrt(self.width_multiplier)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = self.init_std * hidden_scale if id(module) in hidden else self.init_std
                nn.init.normal_(module.weight, std=std)
                if getattr(module, "bias", None) is not None:  # qkv_bias
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                module.reset_parameters()
        # Projections that write into the residual stream are scaled down with depth (GPT-2), so
        # the stream's variance at init does not grow with n_layers.
        residual_std = self.init_std / math.sqrt(2 * len(self.layers)) * hidden_scale
        for block in self.layers:
            nn.init.normal_(block.attention.wo.weight, std=residual_std)
            nn.init.normal_(block.mlp.w2.weight, std=residual_std)

    def mup_hidden_matrices(self) -> HiddenMatrices:
        """muP's hidden weights (trained with lr/width_multiplier under Adam); none with mup off.

        Embeddings, norm gains and the readout keep the base lr: the readout's 1/width is its logit multiplier.
        """
        if not self.mup:
            return HiddenMatrices(1.0, [])
        return HiddenMatrices(self.width_multiplier, [module.weight for module in self._hidden_linears()])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.rope_cos, self.rope_sin)
        logits = self.output(self.norm(h))
        # muP readout: the output weights' Adam updates move logits by ~width, so logits carry 1/width_multiplier.
        return logits / self.width_multiplier if self.mup else logits
