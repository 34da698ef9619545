"""Decoder: the scaffolding every decoder family shares around its blocks.

Token embedding -> `layers` (an nn.ModuleList of blocks) -> final RMSNorm -> output projection, with
optional embedding tying and RoPE tables; the init (normal weights, GPT-2 depth scaling of residual
writes); and muP (hidden-matrix init and learning rates, the readout's 1/width). A family subclasses
Decoder, passes a function that builds one of its blocks, and adds only what is particular to it.

Each block implements residual_projections(): the linear layers that write into the residual stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from currytrain.model.layers import RMSNorm, RopeScaling, build_rope_cache
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
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.init_std = init_std
        self.mup = mup
        self.width_multiplier = mup_width_multiplier(dim, mup, mup_base_width)
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(build_block() for _ in range(n_layers))
        self.norm = RMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # Dynamic scaling rebuilds the tables in forward for inputs longer than the original context.
        self.rope_dynamic = (rope_head_dim, rope_theta, rope_scaling) if rope_scaling is not None and rope_scaling.kind == "dynamic" else None
        if rope_head_dim is not None:
            # Computed on the CPU, then placed. On the meta device (a model built for its shapes) torch would run the
            # float arange through its Python reference kernels, whose first call imports torch._dynamo (0.7 s).
            cos, sin = build_rope_cache(max_seq_len, rope_head_dim, rope_theta, device="cpu", scaling=rope_scaling)
            device = torch.get_default_device()
            # Non-persistent: derived from the config, so checkpoints and HF exports carry only weights.
            self.register_buffer("rope_cos", cos.to(device), persistent=False)
            self.register_buffer("rope_sin", sin.to(device), persistent=False)
        self.reset_parameters()

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

    def rope_tables(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos/sin tables for an input of seq_len tokens: the cached ones, or with dynamic scaling beyond
        the original context, tables whose base follows seq_len (every position of the input uses it)."""
        if self.rope_dynamic is None or seq_len <= self.rope_dynamic[2].original_max_seq_len:
            return self.rope_cos, self.rope_sin
        head_dim, theta, scaling = self.rope_dynamic
        return build_rope_cache(seq_len, head_dim, scaling.dynamic_theta(theta, seq_len, head_dim), device=self.rope_cos.device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        cos, sin = self.rope_tables(tokens.shape[1])
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.readout(h)
