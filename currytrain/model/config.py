"""Typed configs of the model group (conf/model/). Torch-free so that composing a config stays fast."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecoderConfig:
    """Fields every decoder family shares; model/size/*.yaml sets them. Families subclass it."""

    _target_: str = "???"
    vocab_size: int = 256
    """Number of token ids the embedding covers; must be >= the data's vocabulary."""
    dim: int = 128
    """Width of the residual stream."""
    n_layers: int = 4
    """Number of transformer blocks."""
    n_heads: int = 4
    """Query heads per attention layer; must divide dim."""
    n_kv_heads: int = 2
    """Key/value heads; must divide n_heads (== n_heads is plain multi-head attention, 1 is MQA)."""
    mlp_hidden: int = 384
    """Hidden width of the SwiGLU MLP."""
    max_seq_len: int = 128
    """Longest sequence the RoPE tables cover (tokens)."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    tie_embeddings: bool = False
    """Share the token embedding with the output projection."""
    init_std: float = 0.02
    """Std of the normal init of linear and embedding weights."""


@dataclass
class GQAConfig(DecoderConfig):
    """Llama-style decoder: grouped-query attention, RoPE, RMSNorm, SwiGLU MLP."""

    _target_: str = "currytrain.model.gqa.GQATransformer"
    qkv_bias: bool = False
    """Give the query/key/value projections a bias (Qwen2); the output projection never has one."""
    qk_norm: bool = False
    """RMS-normalise each query and key head (learned gain of size dim/n_heads) before RoPE (Qwen3)."""
