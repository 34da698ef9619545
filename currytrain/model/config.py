"""Typed configs of the model group (conf/model/). Torch-free so that composing a config stays fast."""

from __future__ import annotations

from dataclasses import dataclass

AC_MODES = ("none", "full", "selective")
"""Activation-checkpointing modes (model.ac); parallelize_decoder implements each."""
AC_POLICIES = ("block", "op")
"""What model.ac=selective recomputes (model.ac_policy)."""
APPLIED_FROM_OUTSIDE = ("ac", "ac_policy", "ac_every")
"""DecoderConfig fields that are not constructor arguments: parallelize_decoder applies them to the built
model, so build_model() leaves them out. The one list of such fields."""


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
    """Std of the normal init of linear and embedding weights (at mup_base_width when mup=true)."""
    mup: bool = False
    """Maximal update parameterisation (muP): hidden matrices start with std init_std*sqrt(base/width) and
    train with lr*base/width (Adam), logits are multiplied by base/width and attention scores by
    sqrt(base/width)/sqrt(head_dim), i.e. 1/head_dim as width grows (width=dim, base=mup_base_width).
    At dim == mup_base_width the model and its training equal mup=false, so hyperparameters tuned there
    transfer to wider models. Assumes widths vary at fixed n_heads/n_kv_heads and mlp_hidden/dim."""
    mup_base_width: int = 128
    """With mup=true: the dim at which hyperparameters (lr, init_std) were tuned."""
    ac: str = "none"
    """Activation checkpointing: none (keep every activation for backward), full (keep only each block's
    input and recompute the block in backward), selective (see ac_policy). Applied by parallelize_decoder."""
    ac_policy: str = "block"
    """With ac=selective: block (recompute every ac_every-th block whole, keep the others) or op (in every
    block keep the matmul and attention outputs, recompute the cheap elementwise ops and norms)."""
    ac_every: int = 2
    """With ac=selective and ac_policy=block: checkpoint blocks 0, k, 2k, ... of model.layers
    (1 checkpoints all of them, like ac=full)."""


@dataclass
class GQAConfig(DecoderConfig):
    """Llama-style decoder: grouped-query attention, RoPE, RMSNorm, SwiGLU MLP."""

    _target_: str = "currytrain.model.gqa.GQATransformer"
