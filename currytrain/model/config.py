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


@dataclass
class MoEConfig(DecoderConfig):
    """Decoder whose MLPs are mixture-of-experts blocks: a top-k router over a bank of SwiGLU experts.

    Attention, norms and embeddings are those of the GQA decoder. The size group's mlp_hidden is the
    width of the optional shared expert; routed experts have their own width, expert_hidden.
    """

    _target_: str = "currytrain.model.moe.MoETransformer"
    num_experts: int = 4
    """Routed experts per MoE layer."""
    top_k: int = 2
    """Experts each token is sent to; 1 <= top_k <= num_experts."""
    expert_hidden: int = 192
    """Hidden width of each routed SwiGLU expert. top_k * expert_hidden == mlp_hidden gives the dense
    model's active MLP FLOPs per token (192 = 384 / 2 at the debug size)."""
    gating: str = "softmax"
    """Router score function: softmax (over all experts; Mixtral, Switch) or sigmoid (per expert; DeepSeek-V3)."""
    renormalize: bool = True
    """Rescale each token's top-k weights to sum to 1. With top_k=1 and softmax this makes every weight 1,
    so the router then learns from the auxiliary losses only."""
    capacity_factor: float = 0.0
    """Slots per expert as a multiple of the balanced load, capacity = ceil(factor * tokens * top_k /
    num_experts) per forward pass; assignments beyond it are dropped (the token keeps its residual).
    0 is dropless: every assignment is computed."""
    aux_loss_coef: float = 0.01
    """Weight of the load-balancing loss (Switch/GShard; 1.0 when perfectly balanced), per MoE layer, summed over layers."""
    z_loss_coef: float = 0.001
    """Weight of the router z-loss (ST-MoE: mean squared logsumexp of the router logits), per layer, summed."""
    shared_expert: bool = False
    """Add a dense SwiGLU of width mlp_hidden that every token passes through, next to the routed experts."""
