"""Typed configs of the model group (conf/model/). Torch-free so that composing a config stays fast."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from currytrain.rules import bounded, divisors, one_of

AC_MODES = ("none", "full", "selective")
"""Activation-checkpointing modes (model.ac); parallelize_decoder implements each."""
AC_POLICIES = ("block", "op")
"""What model.ac=selective recomputes (model.ac_policy)."""
APPLIED_FROM_OUTSIDE = ("ac", "ac_policy", "ac_every")
"""DecoderConfig fields that are not constructor arguments: parallelize_decoder applies them to the built
model, so build_model() leaves them out. The one list of such fields."""


@dataclass
class ModelConfig:
    """Fields every model has, built-in family or a project's own (experiments/): its class, and the activation
    checkpointing parallelize_decoder applies from outside to the blocks in `model.layers`."""

    _target_: str = "???"
    ac: str = "none"
    """Activation checkpointing: none (keep every activation for backward), full (keep only each block's
    input and recompute the block in backward), selective (see ac_policy). Applied by parallelize_decoder."""
    ac_policy: str = "block"
    """With ac=selective: block (recompute every ac_every-th block whole, keep the others) or op (in every
    block keep the matmul and attention outputs, recompute the cheap elementwise ops and norms)."""
    ac_every: int = bounded(2, ge=1)
    """With ac=selective and ac_policy=block: checkpoint blocks 0, k, 2k, ... of model.layers
    (1 checkpoints all of them, like ac=full)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        """Activation-checkpointing fields."""
        return one_of(node, path, "ac", AC_MODES, fix="full") + one_of(node, path, "ac_policy", AC_POLICIES)


@dataclass
class DecoderConfig(ModelConfig):
    """Fields every decoder family shares; model/size/*.yaml sets them. Families subclass it."""

    vocab_size: int = bounded(256, ge=1)
    """Number of token ids the embedding covers; must be >= the data's vocabulary."""
    dim: int = bounded(128, ge=1)
    """Width of the residual stream."""
    n_layers: int = bounded(4, ge=1)
    """Number of transformer blocks."""
    n_heads: int = bounded(4, ge=1)
    """Query heads per attention layer; must divide dim."""
    n_kv_heads: int = bounded(2, ge=1)
    """Key/value heads; must divide n_heads (== n_heads is plain multi-head attention, 1 is MQA)."""
    mlp_hidden: int = bounded(384, ge=1)
    """Hidden width of the SwiGLU MLP."""
    max_seq_len: int = bounded(128, ge=1)
    """Longest sequence the RoPE tables cover (tokens)."""
    rope_theta: float = bounded(10000.0, gt=0)
    """RoPE base frequency."""
    norm_eps: float = bounded(1e-5, gt=0)
    """RMSNorm epsilon."""
    tie_embeddings: bool = False
    """Share the token embedding with the output projection."""
    init_std: float = bounded(0.02, gt=0)
    """Std of the normal init of linear and embedding weights (at mup_base_width when mup=true)."""
    mup: bool = False
    """Maximal update parameterisation (muP): hidden matrices start with std init_std*sqrt(base/width) and
    train with lr*base/width (Adam), logits are multiplied by base/width and attention scores by
    sqrt(base/width)/sqrt(head_dim), i.e. 1/head_dim as width grows (width=dim, base=mup_base_width).
    At dim == mup_base_width the model and its training equal mup=false, so hyperparameters tuned there
    transfer to wider models. Assumes widths vary at fixed n_heads/n_kv_heads and mlp_hidden/dim."""
    mup_base_width: int = bounded(128, ge=1, example="{dim}")
    """With mup=true: the dim at which hyperparameters (lr, init_std) were tuned."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        """How the head counts divide the width and each other (the fields' ranges are declared with them)."""
        problems: list[str] = []
        if node.n_heads < 1 or node.n_kv_heads < 1 or node.dim < 1:
            return problems
        if node.dim % node.n_heads and not node.get("head_dim", 0):
            also = f" or set {path}.head_dim" if "head_dim" in node else ""
            problems.append(f"{path}.n_heads={node.n_heads} does not divide {path}.dim={node.dim}: choose {path}.n_heads in {divisors(node.dim)[:12]}{also}")
        if node.n_heads % node.n_kv_heads:
            problems.append(
                f"{path}.n_kv_heads={node.n_kv_heads} does not divide {path}.n_heads={node.n_heads}: choose {path}.n_kv_heads in {divisors(node.n_heads)}"
            )
        return problems


ROPE_SCALINGS = ("none", "linear", "llama3", "yarn", "dynamic", "longrope")
"""RoPE frequency scalings (model.rope_scaling); build_rope_cache implements each."""
NORM_POSITIONS = ("pre", "sandwich", "post")
"""Where a block's RMSNorms sit (model.norm_position); model.blocks implements each."""
QK_NORM_SCOPES = ("head", "projection")
"""What model.qk_norm normalises (model.qk_norm_scope)."""
MLP_ACTIVATIONS = ("silu", "gelu_tanh", "gelu")
"""The gate activation of the gated MLP (model.mlp_activation): SwiGLU, GeGLU (tanh approximation), GeGLU (erf)."""
LAYER_TYPES = ("full", "sliding")
"""Attention span of a layer in model.layer_types."""


def head_size(node: Any) -> int:
    """The per-head width: model.head_dim when set, else dim / n_heads."""
    return node.head_dim if node.get("head_dim", 0) else node.dim // max(1, node.n_heads)


def rotated_size(node: Any) -> int:
    """The channels of each query/key head RoPE rotates: model.rope_dim when set, else the whole head."""
    return node.rope_dim if node.get("rope_dim", 0) else head_size(node)


def _longrope_problems(node: Any, path: str) -> list[str]:
    """rope_scaling=longrope needs a short and a long factor per rotated channel pair (each > 0: declared with them)."""
    if node.rope_scaling != "longrope":
        return []
    pairs, problems = rotated_size(node) // 2, []
    for key in ("rope_short_factor", "rope_long_factor"):
        factors = list(node[key])
        if len(factors) != pairs:
            problems.append(f"{path}.{key} has {len(factors)} entries, rope_scaling=longrope needs one per rotated channel pair: pass {pairs} numbers")
    return problems


def _block_problems(node: Any, path: str) -> list[str]:
    """Norm placement, activation, scales and soft-caps, the layer pattern and the rotated width."""
    problems = one_of(node, path, "norm_position", NORM_POSITIONS) + one_of(node, path, "qk_norm_scope", QK_NORM_SCOPES)
    problems += one_of(node, path, "mlp_activation", MLP_ACTIVATIONS)
    if node.mup and node.attn_scale > 0:
        problems.append(f"{path}.attn_scale={node.attn_scale} and {path}.mup=true both set the attention scale: pass {path}.attn_scale=0 (or {path}.mup=false)")
    types = list(node.layer_types)
    unknown = [t for t in types if t not in LAYER_TYPES]
    if unknown:
        problems.append(f"{path}.layer_types={types} holds {unknown}: each entry is one of {list(LAYER_TYPES)}, e.g. {path}.layer_types=[sliding,full]")
    if "sliding" in types and not node.sliding_window > 0:
        problems.append(f"{path}.layer_types={types} has sliding layers but {path}.sliding_window={node.sliding_window}: pass {path}.sliding_window=<tokens>")
    sliding = "sliding" in types or (not types and node.sliding_window > 0)
    if node.rope_local_theta > 0 and not sliding:
        problems.append(f"{path}.rope_local_theta={node.rope_local_theta} rotates the sliding layers, and there are none: pass {path}.rope_local_theta=0")
    if node.rope_dim > 0 and node.n_heads >= 1 and (node.rope_dim % 2 or node.rope_dim > head_size(node)):
        problems.append(f"{path}.rope_dim={node.rope_dim} must be even and at most the head size {head_size(node)}: pass {path}.rope_dim=0 (all channels)")
    return problems


def _latent_problems(node: Any, path: str) -> list[str]:
    """Multi-head latent attention (kv_lora_rank > 0): a decoupled RoPE part narrower than the head, one kv head per query head."""
    problems: list[str] = []
    if not node.kv_lora_rank > 0:
        return problems
    rope_dim = node.rope_dim
    if not 0 < rope_dim < head_size(node):
        problems.append(
            f"{path}.kv_lora_rank={node.kv_lora_rank} (latent attention) needs {path}.rope_dim, the decoupled RoPE width, in (0, head size "
            f"{head_size(node)}): pass e.g. {path}.rope_dim={max(2, head_size(node) // 3 // 2 * 2)}"
        )
    if node.n_kv_heads != node.n_heads:
        problems.append(f"{path}.kv_lora_rank={node.kv_lora_rank} (latent attention) expands keys and values per head: pass {path}.n_kv_heads={node.n_heads}")
    for key, off in (("qk_norm", False), ("qkv_bias", False), ("attn_softcap", 0.0)):
        if node[key] != off:
            problems.append(
                f"{path}.{key}={node[key]} is not offered with latent attention ({path}.kv_lora_rank={node.kv_lora_rank}): pass {path}.{key}={off}".replace(
                    "False", "false"
                )
            )
    return problems


@dataclass
class RopeDecoderConfig(DecoderConfig):
    """The fields of the decoders whose attention rotates queries and keys (RoPE): gqa and moe."""

    head_dim: int = bounded(0, ge=0)
    """Width of each attention head; 0 derives it as dim/n_heads. Set it when a checkpoint's heads are wider
    or narrower than that (Qwen3-0.6B: dim 1024, 16 heads of 128); q/k/v project dim -> n_heads*head_dim."""
    rope_scaling: str = "none"
    """RoPE frequency scaling: none, linear (every frequency / rope_factor: position interpolation), llama3
    (Llama 3.1+: low frequencies / rope_factor, high ones kept, a smooth ramp between) or yarn (Qwen2.5/3
    long context, DeepSeek: the same idea with the ramp set by rotation counts, plus an attention temperature)
    or dynamic (NTK: unscaled up to rope_original_max_seq_len, a longer input raises theta with its length)."""
    rope_factor: float = bounded(1.0, gt=0, example=8.0)
    """With rope_scaling=linear|llama3|yarn: how much the context is stretched (Llama 3.1: 8, Llama 3.2: 32)."""
    rope_low_freq_factor: float = bounded(1.0, gt=0)
    """With rope_scaling=llama3: wavelengths above rope_original_max_seq_len/this are divided by rope_factor."""
    rope_high_freq_factor: float = bounded(4.0, gt=0)
    """With rope_scaling=llama3: wavelengths below rope_original_max_seq_len/this are kept; must exceed the low one."""
    rope_original_max_seq_len: int = bounded(8192, ge=1)
    """With rope_scaling=llama3|yarn|dynamic: the context length (tokens) the model was pretrained at before scaling."""
    rope_beta_fast: float = bounded(32.0, gt=0)
    """With rope_scaling=yarn: channel pairs turning more than this many times over rope_original_max_seq_len keep their frequency."""
    rope_beta_slow: float = bounded(1.0, gt=0)
    """With rope_scaling=yarn: pairs turning fewer times than this are interpolated by rope_factor (a ramp between)."""
    rope_attention_factor: float = bounded(0.0, ge=0)
    """With rope_scaling=yarn: what cos and sin are multiplied by (sharper attention at long range);
    0 derives 0.1 * ln(rope_factor) + 1."""
    rope_truncate: bool = True
    """With rope_scaling=yarn: round the ramp's ends to whole pairs (transformers' default; gpt-oss sets false)."""
    sliding_window: int = bounded(0, ge=0)
    """Each token attends to itself and the sliding_window - 1 tokens before it (Mistral v0.1: every layer;
    with layer_types: the sliding layers only); 0 attends over the whole causal context."""
    layer_types: list[str] = field(default_factory=list)
    """Per-layer attention span, repeated over the layers: layer i is layer_types[i % len] (full or sliding),
    e.g. [sliding, full] alternates (Gemma 2), five sliding then one full (Gemma 3), or one entry per layer
    (Qwen2's max_window_layers); entries beyond n_layers are unused (a shallower model keeps its pattern).
    Empty: every layer is sliding when sliding_window > 0, else full."""
    rope_local_theta: float = bounded(0.0, ge=0)
    """RoPE base of the sliding layers (Gemma 3's local layers, unscaled); 0 rotates them like the full layers."""
    rope_dim: int = bounded(0, ge=0)
    """Channels of each query/key head that RoPE rotates, the first ones (partial rotary: Phi-3 variants; with
    kv_lora_rank: the decoupled RoPE part of each head); 0 rotates all head_dim channels. Even."""
    rope_short_factor: list[float] = bounded(default_factory=list, gt=0)
    """With rope_scaling=longrope (Phi-3 128k): per channel pair, what the frequency is divided by for inputs up to
    rope_original_max_seq_len tokens (rope_dim/2 or head_dim/2 entries)."""
    rope_long_factor: list[float] = bounded(default_factory=list, gt=0)
    """With rope_scaling=longrope: the same for longer inputs (every position of such an input uses it)."""
    qkv_bias: bool = False
    """Give the query/key/value projections a bias (Qwen2); the output projection never has one."""
    qk_norm: bool = False
    """RMS-normalise queries and keys before RoPE (Qwen3, Gemma 3, OLMo 2; see qk_norm_scope)."""
    qk_norm_scope: str = "head"
    """With qk_norm: head (one gain of size head_dim, each head normalised alone: Qwen3, Gemma 3) or projection
    (all heads' channels normalised together, with a gain per channel: OLMo 2)."""
    norm_position: str = "pre"
    """Where each block's RMSNorms sit: pre (x + f(norm(x)), Llama), sandwich (x + norm(f(norm(x))), Gemma 2/3)
    or post (x + norm(f(x)), OLMo 2), for f the attention and the MLP alike."""
    norm_unit_offset: bool = False
    """Every RMSNorm multiplies by 1 + weight (weights start at 0) instead of weight (Gemma)."""
    mlp_activation: str = "silu"
    """Gate activation of the gated MLPs (experts included): silu (SwiGLU), gelu_tanh (GeGLU with the tanh
    approximation, Gemma) or gelu (GeGLU, exact erf)."""
    scale_embeddings: bool = False
    """Multiply the token embeddings by sqrt(dim) (Gemma); the readout of a tied head is not scaled."""
    attn_scale: float = bounded(0.0, ge=0)
    """What q.k is multiplied by before the softmax; 0 is 1/sqrt(head_dim) (muP's own scale with mup=true).
    Gemma: query_pre_attn_scalar**-0.5; DeepSeek with YaRN: includes mscale_all_dim's temperature. >= 0."""
    attn_softcap: float = bounded(0.0, ge=0)
    """Soft-capping of the attention scores: cap * tanh(scores / cap) before the mask and softmax (Gemma 2: 50);
    0 leaves them uncapped (and the fused attention kernels in use). >= 0."""
    logit_softcap: float = bounded(0.0, ge=0)
    """Soft-capping of the output logits, cap * tanh(logits / cap) (Gemma 2: 30); 0 leaves them uncapped. >= 0."""
    kv_lora_rank: int = bounded(0, ge=0)
    """Multi-head latent attention (DeepSeek-V2/V3, Moonlight) when > 0: keys and values are expanded per head
    from one RMS-normalised latent of this width per token, plus one shared RoPE key of rope_dim channels;
    head_dim is each query/key head's width (its non-rotated part is head_dim - rope_dim). 0: GQA attention."""
    q_lora_rank: int = bounded(0, ge=0)
    """With kv_lora_rank: queries pass through a normalised low-rank latent of this width; 0 projects them directly."""
    v_head_dim: int = bounded(0, ge=0)
    """With kv_lora_rank: width of each value head; 0 is head_dim."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        """RoPE needs an even head size; the scalings' paired fields in order."""
        problems = one_of(node, path, "rope_scaling", ROPE_SCALINGS)
        if node.head_dim > 0 and node.head_dim % 2:
            problems.append(f"{path}.head_dim={node.head_dim} is odd, RoPE needs an even head size: pass {path}.head_dim={node.head_dim + 1}")
        elif node.head_dim == 0 and node.n_heads >= 1 and node.dim % node.n_heads == 0 and head_size(node) % 2:
            problems.append(f"{path}.dim/{path}.n_heads={head_size(node)} is odd, RoPE needs an even head size: change {path}.dim or {path}.n_heads")
        if node.rope_scaling == "yarn":
            if not node.rope_beta_fast > node.rope_beta_slow > 0:
                problems.append(
                    f"{path}.rope_beta_fast={node.rope_beta_fast} must exceed {path}.rope_beta_slow={node.rope_beta_slow} > 0: "
                    f"pass {path}.rope_beta_fast=32 {path}.rope_beta_slow=1"
                )
        if node.rope_scaling == "llama3":
            if not node.rope_high_freq_factor > node.rope_low_freq_factor > 0:
                problems.append(
                    f"{path}.rope_high_freq_factor={node.rope_high_freq_factor} must exceed {path}.rope_low_freq_factor="
                    f"{node.rope_low_freq_factor} > 0: pass {path}.rope_low_freq_factor=1.0 {path}.rope_high_freq_factor=4.0"
                )
        return problems + _longrope_problems(node, path) + _block_problems(node, path) + _latent_problems(node, path)


@dataclass
class GQAConfig(RopeDecoderConfig):
    """Llama-style decoder: grouped-query attention, RoPE, RMSNorm, SwiGLU MLP."""

    _target_: str = "currytrain.model.gqa.GQATransformer"


@dataclass
class MoEConfig(RopeDecoderConfig):
    """Decoder whose MLPs are mixture-of-experts blocks: a top-k router over a bank of SwiGLU experts.

    Attention, norms and embeddings are those of the GQA decoder. The size group's mlp_hidden is the
    width of the optional shared expert; routed experts have their own width, expert_hidden.
    """

    _target_: str = "currytrain.model.moe.MoETransformer"
    num_experts: int = bounded(4, ge=1)
    """Routed experts per MoE layer."""
    top_k: int = bounded(2, ge=1)
    """Experts each token is sent to; 1 <= top_k <= num_experts."""
    expert_hidden: int = bounded(192, ge=1)
    """Hidden width of each routed SwiGLU expert. top_k * expert_hidden == mlp_hidden gives the dense
    model's active MLP FLOPs per token (192 = 384 / 2 at the debug size)."""
    gating: str = "softmax"
    """Router score function: softmax (over all experts; Mixtral, Switch) or sigmoid (per expert; DeepSeek-V3)."""
    renormalize: bool = True
    """Rescale each token's top-k weights to sum to 1. With top_k=1 and softmax this makes every weight 1,
    so the router then learns from the auxiliary losses only."""
    capacity_factor: float = bounded(0.0, ge=0)
    """Slots per expert as a multiple of the balanced load, capacity = ceil(factor * tokens * top_k /
    num_experts) per forward pass; assignments beyond it are dropped (the token keeps its residual).
    0 is dropless: every assignment is computed."""
    aux_loss_coef: float = bounded(0.01, ge=0)
    """Weight of the load-balancing loss (Switch/GShard; 1.0 when perfectly balanced), per MoE layer, summed over layers."""
    z_loss_coef: float = bounded(0.001, ge=0)
    """Weight of the router z-loss (ST-MoE: mean squared logsumexp of the router logits), per layer, summed."""
    shared_expert: bool = False
    """Add a dense SwiGLU of width mlp_hidden that every token passes through, next to the routed experts."""
    dense_layers: list[int] = bounded(default_factory=list, ge=0)
    """Layers whose MLP is one dense gated MLP of width dense_hidden instead of experts (DeepSeek-V3's first
    layers, Qwen3-MoE's mlp_only_layers), by index from 0; indices at or beyond n_layers are an error."""
    dense_hidden: int = bounded(0, ge=0)
    """Hidden width of the dense layers' MLP; 0 is mlp_hidden."""
    router_bias: bool = False
    """Keep a per-expert bias (a buffer, not trained by gradient) added to the router scores when choosing the
    top_k experts, not when weighting them (DeepSeek-V3's auxiliary-loss-free balancing; loaded with the weights)."""
    router_groups: int = bounded(1, ge=1)
    """Experts form this many equal groups; each token first keeps the router_group_top_k groups whose two best
    scores sum highest, then picks its top_k experts among them (DeepSeek-V3: 8 groups, 4 kept). 1: no groups."""
    router_group_top_k: int = bounded(1, ge=1)
    """With router_groups > 1: the groups each token keeps; 1 <= this <= router_groups."""
    routed_scale: float = bounded(1.0, gt=0)
    """What the routed experts' combine weights are multiplied by, after renormalize (DeepSeek-V3: 2.5). > 0."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        """Routing fields of model=moe."""
        problems = []
        if node.num_experts >= 1 and not 1 <= node.top_k <= node.num_experts:
            problems.append(f"{path}.top_k={node.top_k} must be in [1, {path}.num_experts={node.num_experts}]: pass {path}.top_k={min(2, node.num_experts)}")
        problems += one_of(node, path, "gating", MOE_GATINGS)
        return problems + _routing_problems(node, path)


def _routing_problems(node: Any, path: str) -> list[str]:
    """Dense layers within the model, group-limited routing that divides the experts (the fields' ranges are declared with them)."""
    problems = []
    outside = [i for i in node.dense_layers if i >= node.n_layers]
    if outside:
        problems.append(f"{path}.dense_layers={list(node.dense_layers)} names layers outside 0..{node.n_layers - 1} ({outside}): remove them")
    groups = node.router_groups
    if groups >= 1 and node.num_experts >= 1 and node.num_experts % groups:
        problems.append(
            f"{path}.router_groups={groups} does not divide {path}.num_experts={node.num_experts}: choose {path}.router_groups in {divisors(node.num_experts)}"
        )
    if groups > 1 and node.router_group_top_k > groups:
        problems.append(
            f"{path}.router_group_top_k={node.router_group_top_k} must be at most {path}.router_groups={groups}: pass {path}.router_group_top_k={groups}"
        )
    elif groups > 1 and node.num_experts % groups == 0 and node.router_group_top_k * (node.num_experts // groups) < node.top_k:
        problems.append(
            f"{path}.router_group_top_k={node.router_group_top_k} groups of {node.num_experts // groups} experts hold fewer than {path}.top_k={node.top_k}: "
            f"raise {path}.router_group_top_k"
        )
    if groups > 1 and node.num_experts // max(groups, 1) < 2:
        problems.append(f"{path}.router_groups={groups} leaves groups of one expert; a group's score sums its two best: pass {path}.router_groups=1")
    return problems


MOE_GATINGS = ("softmax", "sigmoid")
"""Router score functions of model=moe."""

SPIKE_SURROGATES = ("sigmoid", "atan", "triangle")
"""Surrogate derivatives the spiking family offers (model.surrogate); spiking.py implements each."""
SPIKE_RESETS = ("soft", "hard")
"""Membrane resets after a spike (model.reset)."""


@dataclass
class SpikingConfig(DecoderConfig):
    """Spikformer-style decoder of leaky integrate-and-fire (LIF) neurons, run for `timesteps` steps per token.

    Every linear layer reads binary spike trains; the residual stream stays real-valued and is averaged
    over the timesteps before the output head. Attention has no softmax and no RoPE (spike-valued Q/K
    cannot be rotated): positions come from the causal mask alone, so `rope_theta` is unused here and
    `max_seq_len` only bounds data.seq_len. `mlp_hidden` is the width of the spiking MLP (no gate).
    """

    _target_: str = "currytrain.model.spiking.SpikingTransformer"
    timesteps: int = bounded(4, ge=1)
    """Simulation steps T each token is presented for (the same input current every step); compute and
    activation memory grow linearly with T. Must be >= 1."""
    tau: float = bounded(2.0, ge=1)
    """Membrane time constant, in timesteps: each step the membrane keeps 1 - 1/tau of its potential
    before the new input is added (tau=1: no memory; tau=2: halves). Must be >= 1."""
    threshold: float = bounded(1.0, gt=0)
    """Membrane potential at which a neuron spikes (fires when potential >= threshold). Inputs to every
    neuron are RMS-normalised per token, so the unit is one RMS of the input current. Must be > 0."""
    reset: str = "soft"
    """After a spike: soft subtracts the threshold (the excess carries over), hard sets the membrane to 0."""
    surrogate: str = "sigmoid"
    """Pseudo-derivative of the spike used in backward: sigmoid, atan or triangle (the forward stays a step)."""
    surrogate_slope: float = bounded(4.0, gt=0)
    """Sharpness alpha of the surrogate, per unit of membrane potential: the pseudo-derivative at the
    threshold is alpha/4 (sigmoid), alpha/2 (atan) or alpha (triangle, zero beyond 1/alpha); each
    integrates to 1. Must be > 0."""
    detach_reset: bool = True
    """Stop gradients through the reset (the spike that lowers the membrane), as Spikformer does; the
    membrane still leaks gradient through time."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        """The LIF neuron fields of model=spiking (no RoPE: positions come from the causal mask)."""
        return one_of(node, path, "reset", SPIKE_RESETS) + one_of(node, path, "surrogate", SPIKE_SURROGATES)


@dataclass
class MLPConfig(ModelConfig):
    """model=mlp: a classifier of feature vectors (data=digits, data=table), not a decoder."""

    _target_: str = "currytrain.model.mlp.MLPClassifier"
    in_features: int = bounded(64, ge=1)
    """Features per row: the data's column count (data=digits: 64)."""
    num_classes: int = bounded(10, ge=2)
    """Classes the logits cover: at least the data's (data=digits: 10)."""
    dim: int = bounded(128, ge=1)
    """Width of each hidden layer."""
    n_layers: int = bounded(2, ge=1)
    """Hidden layers (Linear + GELU + dropout each), kept in model.layers."""
    dropout: float = bounded(0.0, ge=0, lt=1)
    """Probability of zeroing a hidden unit in training."""
