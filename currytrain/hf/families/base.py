"""What every Hugging Face family mapping shares, and the dense decoder's mapping itself.

A Family turns a transformers config into a curryTrain model node (import) and back (export), lists what it
cannot represent exactly, and renames weights in both directions. The model node's mechanism fields
(MECHANISM_FIELDS: norm placement, qk-norm, windows, soft-caps, routing...) are what select an architecture on
export: a family states the values its architecture always has (`fixed`) and the fields its config carries
(`free`); any other field must keep curryTrain's default, or the export is refused with the field named.

The families whose weights or config differ from the dense decoder's (fused projections, experts, latent
attention) subclass Family in modules of their own beside this one; the registry (currytrain.hf.families)
lists every family.

RoPE: curryTrain pairs channel i with i + head_dim/2 ("rotate half"), as transformers does, so the
q/k projection rows are copied unpermuted (the parity tests in tests/test_hf.py hold this to 1e-5).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from currytrain.model.config import GQAConfig, MoEConfig

# Buffers some older checkpoints still store; derived from the config, never weights.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)

Reader = Callable[[str], torch.Tensor]
"""A checkpoint's tensor by its transformers name: a view into the file (copy what you keep)."""

# transformers' rope_type -> model.rope_scaling, and the scaling keys -> the model.rope_* fields.
ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3", "yarn": "yarn", "dynamic": "dynamic", "longrope": "longrope"}
STANDARD_ROPE = ("none", "linear", "llama3", "yarn", "dynamic")
"""The model.rope_scaling kinds every dense family's transformers class computes (LongRoPE: Phi-3's)."""
ROPE_KEYS = {
    "factor": "rope_factor",
    "low_freq_factor": "rope_low_freq_factor",
    "high_freq_factor": "rope_high_freq_factor",
    "original_max_position_embeddings": "rope_original_max_seq_len",
    "beta_fast": "rope_beta_fast",
    "beta_slow": "rope_beta_slow",
    "attention_factor": "rope_attention_factor",
    "truncate": "rope_truncate",
    "short_factor": "rope_short_factor",
    "long_factor": "rope_long_factor",
}
ROPE_FIELDS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "truncate"),
    "dynamic": ("factor",),
    "longrope": ("factor", "original_max_position_embeddings", "attention_factor", "short_factor", "long_factor"),
}
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
"""transformers' hidden_act -> model.mlp_activation (Gemma configs' legacy "gelu" means the tanh form, which
transformers' GemmaConfig rewrites before we read it)."""
HF_ACTIVATIONS = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}

DENSE_DEFAULTS = dataclasses.asdict(GQAConfig())
MOE_DEFAULTS = dataclasses.asdict(MoEConfig())
MECHANISM_FIELDS = (
    "qkv_bias",
    "qk_norm",
    "qk_norm_scope",
    "norm_position",
    "norm_unit_offset",
    "mlp_activation",
    "scale_embeddings",
    "attn_scale",
    "attn_softcap",
    "logit_softcap",
    "sliding_window",
    "layer_types",
    "rope_local_theta",
    "rope_dim",
    "kv_lora_rank",
    "q_lora_rank",
    "v_head_dim",
)
"""Model fields that change what a decoder computes beyond its sizes: an architecture either maps each one to its
config (Family.free) or has one value of it (Family.fixed, else curryTrain's default). RoPE scaling is checked
apart, against Family.rope_kinds."""
MOE_MECHANISM_FIELDS = (
    "gating",
    "renormalize",
    "capacity_factor",
    "shared_expert",
    "dense_layers",
    "dense_hidden",
    "router_bias",
    "router_groups",
    "router_group_top_k",
    "routed_scale",
)
"""The same for model=moe's routing and layer fields."""


def head_width(node: Mapping[str, Any]) -> int:
    return node.get("head_dim") or node["dim"] // node["n_heads"]


def mechanism(node: Mapping[str, Any]) -> dict[str, Any]:
    """The node's mechanism fields, those that cannot matter set to their defaults (a qk_norm_scope without
    qk_norm, q_lora_rank without latent attention, an attn_scale equal to the default 1/sqrt(head_dim)...)."""
    moe = "num_experts" in node
    defaults = MOE_DEFAULTS if moe else DENSE_DEFAULTS
    fields = MECHANISM_FIELDS + (MOE_MECHANISM_FIELDS if moe else ())
    values = {key: node.get(key, defaults.get(key)) for key in fields}
    values["layer_types"] = list(values["layer_types"] or [])
    if not values["qk_norm"]:
        values["qk_norm_scope"] = defaults["qk_norm_scope"]
    if not values["kv_lora_rank"]:
        values["q_lora_rank"] = values["v_head_dim"] = 0
    elif values["v_head_dim"] == head_width(node):
        values["v_head_dim"] = 0
    if values["rope_dim"] == head_width(node):
        values["rope_dim"] = 0
    if values["attn_scale"] and math.isclose(values["attn_scale"], head_width(node) ** -0.5, rel_tol=1e-12):
        values["attn_scale"] = 0.0
    if set(layer_kinds(node)) == {"sliding"}:
        values["layer_types"] = []  # every layer sliding: the window alone says it
    elif "sliding" not in layer_kinds(node):
        values["layer_types"], values["sliding_window"], values["rope_local_theta"] = [], 0, 0.0
    if moe:
        values["dense_layers"] = sorted(values["dense_layers"] or [])
        if not values["dense_layers"]:
            values["dense_hidden"] = 0
        if values["router_groups"] <= 1:
            values["router_groups"] = values["router_group_top_k"] = 1
    return values


def layer_kinds(node: Mapping[str, Any]) -> list[str]:
    """full or sliding for each layer of a model node (model.layer_types repeated, or the window over all)."""
    types, window = list(node.get("layer_types") or []), node.get("sliding_window") or 0
    if types:
        return [types[i % len(types)] for i in range(node["n_layers"])]
    return ["sliding" if window else "full"] * node["n_layers"]


def describe(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# ---------------------------------------------------------------------------------------------- config


def rope_parameters(hf: Any) -> dict[str, Any]:
    """transformers' RoPE parameters of a config, one dict: v5 keeps them in rope_parameters (per layer type for
    Gemma 3 and OLMo 3: the full layers'), v4 in rope_theta + rope_scaling."""
    params = getattr(hf, "rope_parameters", None)
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]
    if isinstance(params, dict):
        return dict(params)
    return {"rope_theta": float(getattr(hf, "rope_theta", 10000.0)), **dict(getattr(hf, "rope_scaling", None) or {})}


def _rope(hf: Any) -> tuple[float, dict[str, Any]]:
    """(theta, scaling) of a config; scaling holds the keys besides the theta, none for the default rope."""
    params = rope_parameters(hf)
    extra = {k: v for k, v in params.items() if k != "rope_theta" and not (k == "rope_type" and v == "default")}
    if extra.get("rope_type", extra.get("type", "default")) == "default":
        extra = {}
    return float(params.get("rope_theta", 10000.0)), extra


def rope_kind(hf: Any) -> str:
    """transformers' rope_type of a config ("default" when unscaled)."""
    _, scaling = _rope(hf)
    return scaling.get("rope_type", scaling.get("type", "default"))


def activation(hf: Any) -> str:
    """The gate activation a config's model computes: Gemma 2/3 read hidden_activation, the others hidden_act."""
    return getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", None) or "silu"


def decoder_problems(hf: Any, rope_kinds: Sequence[str] = STANDARD_ROPE) -> list[str]:
    """What every supported architecture shares and curryTrain's decoder cannot represent otherwise."""
    problems = []
    heads, hidden = hf.num_attention_heads, hf.hidden_size
    act = activation(hf)
    if act not in ACTIVATIONS:
        problems.append(f"hidden_act={act}: curryTrain's gated MLP offers {sorted(ACTIVATIONS)}")
    if hidden % heads and not getattr(hf, "head_dim", None):
        problems.append(f"hidden_size={hidden} is not divisible by num_attention_heads={heads} and head_dim is not set")
    kind = rope_kind(hf)
    if ROPE_TYPES.get(kind) not in rope_kinds:
        offered = [k + (" (Llama 3.1-3.3)" if k == "llama3" else "") for k, v in ROPE_TYPES.items() if v in rope_kinds]
        offered = ", ".join(offered[:-1]) + " and " + offered[-1] if len(offered) > 1 else offered[0]
        problems.append(
            f"rope scaling rope_type={kind} {rope_parameters(hf)}: not supported for {type(hf).__name__.removesuffix('Config')}, curryTrain "
            f"implements rope_type {offered} for it; the others are not converted approximately"
        )
    if getattr(hf, "quantization_config", None):
        problems.append("quantization_config is set: import an unquantized checkpoint")
    return problems


def partial_rotary_problems(hf: Any) -> list[str]:
    factor = rope_parameters(hf).get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", 1.0))
    if factor not in (None, 1.0):
        return [f"partial_rotary_factor={factor}: this architecture rotates the full head dimension in curryTrain's mapping"]
    return []


def window_problems(hf: Any, windows: str) -> list[str]:
    """Sliding windows a family with `windows` (none, all, layers) cannot take from this config."""
    types = list(getattr(hf, "layer_types", None) or [])
    other = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if other:
        return [f"layer_types holds {other}: curryTrain's layers are full_attention or sliding_attention"]
    window = getattr(hf, "sliding_window", None)
    sliding = "sliding_attention" in types if types else bool(window) and getattr(hf, "use_sliding_window", True)
    if not sliding:
        return []
    if not window:
        return [f"layer_types has sliding_attention layers but sliding_window={window}"]
    if windows == "none":
        return [f"sliding-window attention (sliding_window={window}): curryTrain's {type(hf).__name__} mapping attends over the full causal context"]
    if windows == "all" and types and "full_attention" in types:
        return [f"layer_types mixes sliding and full layers: {type(hf).__name__}'s model applies its window to every layer (Ministral's alternates)"]
    return []


def periodic(values: Sequence[str]) -> list[str]:
    """The shortest prefix whose repetition is `values` (model.layer_types repeats over the layers)."""
    for period in range(1, len(values) + 1):
        if all(values[i] == values[i % period] for i in range(len(values))):
            return list(values[:period])
    return list(values)


def window_node(hf: Any) -> dict[str, Any]:
    """model.sliding_window and model.layer_types of a config: a window over every layer (Mistral, Mixtral,
    Phi-3: no layer_types, or all sliding) is the window alone; a mix keeps its shortest repeating pattern."""
    types = list(getattr(hf, "layer_types", None) or [])
    window = getattr(hf, "sliding_window", None)
    if not types:
        sliding = bool(window) and getattr(hf, "use_sliding_window", True)
        return {"sliding_window": int(window)} if sliding else {}
    kinds = ["sliding" if t == "sliding_attention" else "full" for t in types]
    if "sliding" not in kinds:
        return {}
    if "full" not in kinds:
        return {"sliding_window": int(window)}
    return {"sliding_window": int(window), "layer_types": periodic(kinds)}


def hf_layer_types(node: Mapping[str, Any]) -> list[str]:
    """transformers' layer_types of a model node: one entry per layer."""
    return [f"{kind}_attention" for kind in layer_kinds(node)]


def _head_dim(hf: Any) -> int:
    """head_dim when the config sets one that differs from hidden_size / heads, else 0 (derived)."""
    head_dim = getattr(hf, "head_dim", None)
    return int(head_dim) if head_dim and head_dim * hf.num_attention_heads != hf.hidden_size else 0


def rope_node(hf: Any, scaling: Mapping[str, Any] | None = None, head_dim: int | None = None) -> dict[str, Any]:
    """The model.rope_* fields of a config's RoPE scaling (none: the fields keep their defaults)."""
    if scaling is None:
        _, scaling = _rope(hf)
    kind = ROPE_TYPES[scaling.get("rope_type", scaling.get("type", "default"))]
    if kind == "none":
        return {}
    if kind == "yarn":
        return {"rope_scaling": kind, **yarn_node(hf, scaling)}
    if kind == "longrope":
        return {"rope_scaling": kind, **longrope_node(hf, scaling)}
    if kind == "dynamic":  # transformers measures the growth against max_position_embeddings
        return {"rope_scaling": kind, "rope_factor": float(scaling["factor"]), "rope_original_max_seq_len": int(hf.max_position_embeddings)}
    fields = {ROPE_KEYS[key]: float(scaling[key]) for key in ROPE_FIELDS[kind]}
    if "rope_original_max_seq_len" in fields:  # a token count
        fields["rope_original_max_seq_len"] = int(fields["rope_original_max_seq_len"])
    return {"rope_scaling": kind, **fields}


def decoder_node(hf: Any, target: str) -> dict[str, Any]:
    theta, _ = _rope(hf)
    act = activation(hf)
    node = {
        "_target_": target,
        "vocab_size": int(hf.vocab_size),
        "dim": int(hf.hidden_size),
        "n_layers": int(hf.num_hidden_layers),
        "n_heads": int(hf.num_attention_heads),
        "n_kv_heads": int(hf.num_key_value_heads or hf.num_attention_heads),
        "mlp_hidden": int(hf.intermediate_size),
        "max_seq_len": int(hf.max_position_embeddings),
        "rope_theta": theta,
        "norm_eps": float(hf.rms_norm_eps),
        "tie_embeddings": bool(getattr(hf, "tie_word_embeddings", False)),
        "init_std": float(getattr(hf, "initializer_range", 0.02)),
    }
    if ACTIVATIONS.get(act, "silu") != "silu":
        node["mlp_activation"] = ACTIVATIONS[act]
    if head_dim := _head_dim(hf):
        node["head_dim"] = head_dim
    return {**node, **rope_node(hf)}


def yarn_node(hf: Any, scaling: Mapping[str, Any]) -> dict[str, Any]:
    """The model.rope_* fields of a yarn scaling, every default transformers fills in made explicit: the
    factor (DeepSeek leaves it out: max_position_embeddings / the original), beta_fast/slow, the attention
    factor (from mscale/mscale_all_dim when given), truncate."""
    original = int(scaling["original_max_position_embeddings"])
    factor = float(scaling.get("factor") or hf.max_position_embeddings / original)
    attention = scaling.get("attention_factor")
    if attention is None and scaling.get("mscale") and scaling.get("mscale_all_dim"):
        attention = yarn_temperature(factor, scaling["mscale"]) / yarn_temperature(factor, scaling["mscale_all_dim"])
    return {
        "rope_factor": factor,
        "rope_original_max_seq_len": original,
        "rope_beta_fast": float(scaling.get("beta_fast") or 32),
        "rope_beta_slow": float(scaling.get("beta_slow") or 1),
        "rope_attention_factor": float(attention if attention is not None else yarn_temperature(factor, 1.0)),
        "rope_truncate": bool(scaling.get("truncate", True)),
    }


def yarn_temperature(factor: float, scale: float) -> float:
    """YaRN's attention temperature 0.1 * scale * ln(factor) + 1 (1 when the context is not stretched)."""
    return 0.1 * scale * math.log(factor) + 1.0 if factor > 1 else 1.0


def longrope_node(hf: Any, scaling: Mapping[str, Any]) -> dict[str, Any]:
    """The model.rope_* fields of a LongRoPE scaling (Phi-3 128k), transformers' defaults written out: the factor
    (max_position_embeddings / the original context when absent) and the attention factor it implies."""
    original = int(scaling.get("original_max_position_embeddings") or getattr(hf, "original_max_position_embeddings", hf.max_position_embeddings))
    factor = float(scaling.get("factor") or hf.max_position_embeddings / original)
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
    return {
        "rope_factor": factor,
        "rope_original_max_seq_len": original,
        "rope_attention_factor": float(attention),
        "rope_short_factor": [float(f) for f in scaling["short_factor"]],
        "rope_long_factor": [float(f) for f in scaling["long_factor"]],
    }


def rope_dict(node: Mapping[str, Any]) -> dict[str, Any]:
    """transformers' rope_parameters of a model node's (global) RoPE."""
    kind = node.get("rope_scaling", "none")
    params = {"rope_type": "default" if kind == "none" else kind, "rope_theta": node["rope_theta"]}
    params.update({key: node[ROPE_KEYS[key]] for key in ROPE_FIELDS.get(kind, ())})
    if kind == "longrope":
        params["short_factor"], params["long_factor"] = list(params["short_factor"]), list(params["long_factor"])
    return params


def rope_hf(node: Mapping[str, Any]) -> dict[str, Any]:
    """transformers' RoPE parameters of a model node (v5 reads rope_parameters, v4 rope_theta + rope_scaling)."""
    params = rope_dict(node)
    kind = node.get("rope_scaling", "none")
    return {"rope_parameters": params, "rope_theta": node["rope_theta"], "rope_scaling": None if kind == "none" else params}


def per_layer_type_rope(hf: Any) -> tuple[dict[str, Any], list[str]]:
    """model.rope_local_theta of a config that keeps RoPE per layer type (Gemma 3, OLMo 3): the sliding layers'
    theta when they rotate otherwise than the full layers, which must then be unscaled. (fields, problems)."""
    params = getattr(hf, "rope_parameters", None) or {}
    local = params.get("sliding_attention") if isinstance(params, dict) else None
    full = params.get("full_attention") if isinstance(params, dict) else None
    if not isinstance(local, dict) or not isinstance(full, dict) or "sliding_attention" not in (getattr(hf, "layer_types", None) or []):
        return {}, []
    if local == full:
        return {}, []
    if local.get("rope_type", "default") != "default":
        return {}, [f"rope_parameters.sliding_attention={local}: curryTrain rotates sliding layers with an unscaled (default) RoPE of their own theta"]
    return {"rope_local_theta": float(local.get("rope_theta", 10000.0))}, []


def per_layer_type_rope_hf(node: Mapping[str, Any]) -> dict[str, Any]:
    """transformers' per-layer-type rope_parameters of a model node (Gemma 3, OLMo 3)."""
    full = rope_dict(node)
    local = {"rope_type": "default", "rope_theta": node["rope_local_theta"]} if node.get("rope_local_theta") else dict(full)
    return {"rope_parameters": {"full_attention": full, "sliding_attention": local}}


def decoder_hf_kwargs(node: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "vocab_size": node["vocab_size"],
        "hidden_size": node["dim"],
        "num_hidden_layers": node["n_layers"],
        "num_attention_heads": node["n_heads"],
        "num_key_value_heads": node["n_kv_heads"],
        "head_dim": head_width(node),
        "intermediate_size": node["mlp_hidden"],
        # Dynamic RoPE scales against max_position_embeddings: it must be the original context, not a longer max_seq_len.
        "max_position_embeddings": node["rope_original_max_seq_len"] if node.get("rope_scaling") == "dynamic" else node["max_seq_len"],
        "rms_norm_eps": node["norm_eps"],
        "tie_word_embeddings": node["tie_embeddings"],
        "initializer_range": node["init_std"],
        "hidden_act": HF_ACTIVATIONS[node.get("mlp_activation", "silu")],
        **rope_hf(node),
    }


# ---------------------------------------------------------------------------------------------- weights


NORM_NAMES = {
    # model.norm_position -> (curryTrain norm, transformers norm) of each block
    "pre": (("attention_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")),
    "sandwich": (
        ("attention_norm", "input_layernorm"),
        ("post_attention_norm", "post_attention_layernorm"),
        ("mlp_norm", "pre_feedforward_layernorm"),
        ("post_mlp_norm", "post_feedforward_layernorm"),
    ),
    "post": (("post_attention_norm", "post_attention_layernorm"), ("post_mlp_norm", "post_feedforward_layernorm")),
}


def norm_names(node: Mapping[str, Any], i: int) -> list[tuple[str, str]]:
    return [(f"layers.{i}.{ours}.weight", f"model.layers.{i}.{theirs}.weight") for ours, theirs in NORM_NAMES[node.get("norm_position", "pre")]]


def attention_names(node: Mapping[str, Any], i: int) -> list[tuple[str, str]]:
    """The layer's norms and its (unfused) attention projections and q/k norms."""
    ours, theirs = f"layers.{i}.", f"model.layers.{i}."
    pairs = norm_names(node, i)
    for our, hf in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
        pairs.append((f"{ours}attention.{our}.weight", f"{theirs}self_attn.{hf}.weight"))
        if node.get("qkv_bias") and our != "wo":
            pairs.append((f"{ours}attention.{our}.bias", f"{theirs}self_attn.{hf}.bias"))
    if node.get("qk_norm"):
        pairs += [(f"{ours}attention.{n}.weight", f"{theirs}self_attn.{n}.weight") for n in ("q_norm", "k_norm")]
    return pairs


def mlp_names(i: int, ours: str = "mlp", theirs: str = "mlp") -> list[tuple[str, str]]:
    """A gated MLP's weights: w1/w3/w2 <-> gate_proj/up_proj/down_proj."""
    return [
        (f"layers.{i}.{ours}.{our}.weight", f"model.layers.{i}.{theirs}.{hf}.weight")
        for our, hf in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))
    ]


def outer_names(node: Mapping[str, Any]) -> list[tuple[str, str]]:
    pairs = [("tok_embeddings.weight", "model.embed_tokens.weight"), ("norm.weight", "model.norm.weight")]
    if not node["tie_embeddings"]:  # tied: transformers stores only the embedding
        pairs.append(("output.weight", "lm_head.weight"))
    return pairs


@dataclasses.dataclass(frozen=True)
class Fused:
    """One transformers tensor that holds several curryTrain ones stacked along dim 0 (Phi-3's qkv_proj)."""

    theirs: str
    ours: tuple[str, ...]
    sizes: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Family:
    """A dense decoder (model=gqa) whose weights are a renaming: Llama, Mistral, Qwen2/3, Gemma, OLMo 2/3.

    fixed: the model fields this architecture always has (Qwen2: qkv_bias=true); import sets them, export
    requires them. free: the mechanism fields its config carries (read by model_node, written by hf_kwargs).
    windows: how its config holds sliding windows: none, all (one window over every layer: Mistral) or layers
    (transformers' layer_types: Qwen2/3, Gemma 2/3, OLMo 3). rope_kinds: the model.rope_scaling kinds it computes.
    """

    architecture: str
    """transformers class name, the config's `architectures` entry."""
    config_class: str
    """transformers config class that export instantiates."""
    model_type: str
    """The config's model_type; selects the family when a config.json lists no architectures."""
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    free: frozenset[str] = frozenset()
    windows: str = "none"
    rope_kinds: tuple[str, ...] = STANDARD_ROPE
    rope_per_layer_type: bool = False
    """The config keeps RoPE per layer type (Gemma 3, OLMo 3): the sliding layers' own theta is model.rope_local_theta."""

    @property
    def target(self) -> str:
        return GQAConfig._target_

    @property
    def defaults(self) -> dict[str, Any]:
        return DENSE_DEFAULTS

    # -- import

    @property
    def free_fields(self) -> frozenset[str]:
        """The mechanism fields this family's config carries: its own, its windows' and its local RoPE."""
        windows = {"none": (), "all": ("sliding_window",), "layers": ("sliding_window", "layer_types")}[self.windows]
        # Every family's gated MLP applies its config's hidden_act (hidden_activation): the activation is always free.
        return self.free | {"mlp_activation"} | set(windows) | ({"rope_local_theta"} if self.rope_per_layer_type else set())

    def problems(self, hf: Any) -> list[str]:
        problems = decoder_problems(hf, self.rope_kinds) + partial_rotary_problems(hf) + window_problems(hf, self.windows)
        if getattr(hf, "attention_bias", False):
            problems.append("attention_bias=true: curryTrain's attention has no output-projection bias")
        if getattr(hf, "mlp_bias", False):
            problems.append("mlp_bias=true: curryTrain's gated MLP has no biases")
        if self.rope_per_layer_type:
            problems += per_layer_type_rope(hf)[1]
        return problems

    def model_node(self, hf: Any) -> dict[str, Any]:
        node = {**decoder_node(hf, self.target), **self.fixed}
        if "qkv_bias" not in node:  # written out for the dense decoders (what selects Qwen2 on export)
            node.update(qkv_bias=False, qk_norm=bool(node.get("qk_norm", False)))
        if self.windows != "none":
            node.update(window_node(hf))
        if self.rope_per_layer_type:
            node.update(per_layer_type_rope(hf)[0])
        return node

    def ignored(self, name: str, node: Mapping[str, Any]) -> bool:
        """A checkpoint tensor that is no weight of the model (derived buffers): skipped, never refused."""
        return name.endswith(IGNORED_SUFFIXES) or (node["tie_embeddings"] and name == "lm_head.weight")

    def weight_names(self, node: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(curryTrain name, transformers name) of every weight that is a plain renaming."""
        pairs = outer_names(node)
        for i in range(node["n_layers"]):
            pairs += attention_names(node, i) + mlp_names(i)
        return pairs

    def alias(self, name: str) -> str | None:
        """Another name a checkpoint may hold the transformers tensor `name` under (None: it has one name)."""
        return None

    def fused(self, node: Mapping[str, Any]) -> list[Fused]:
        """The transformers tensors that hold several curryTrain ones (none for a plain renaming)."""
        return []

    def to_currytrain(self, read: Reader, available: set[str], node: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], set[str], list[str]]:
        """(state in curryTrain names, transformers names used, transformers names missing). `read` returns views
        into the checkpoint's files: what the state keeps is copied, so that no file outlives its reads."""
        state, used, missing = {}, set(), []
        for ours, theirs in self.weight_names(node):
            source = theirs if theirs in available else self.alias(theirs)
            if source in available:
                state[ours] = read(source).clone()
                used.add(source)
            else:
                missing.append(theirs)
        for fused in self.fused(node):
            if fused.theirs not in available:
                missing.append(fused.theirs)
                continue
            used.add(fused.theirs)
            for name, part in zip(fused.ours, read(fused.theirs).split(list(fused.sizes))):
                state[name] = part.clone()
        return state, used, missing

    # -- export

    def export_problems(self, node: Mapping[str, Any]) -> list[str]:
        """Why this architecture cannot compute what `node` computes (empty: it can)."""
        values, problems = mechanism(node), []
        for key, value in values.items():
            if key in self.free_fields:
                continue
            expected = self.fixed.get(key, mechanism(self.defaults | dict(self.fixed) | _sizes(node))[key])
            if value != expected:
                problems.append(self.mismatch(key, value, expected))
        kind = node.get("rope_scaling", "none")
        if kind not in self.rope_kinds:
            problems.append(f"model.rope_scaling={kind}: {self.architecture} computes rope_scaling {list(self.rope_kinds)}")
        return problems + self.layout_problems(node)

    def mismatch(self, key: str, value: Any, expected: Any) -> str:
        """The message for a mechanism field whose value this architecture does not have."""
        if key in ("sliding_window", "layer_types") and self.windows == "none":
            return f"model.{key}={describe(value)}: {self.architecture} has no sliding window"
        if key == "layer_types":
            return f"model.layer_types={value}: {self.architecture} applies its window to every layer (model.layer_types=[])"
        return f"model.{key}={describe(value)}: {self.architecture} has {key}={describe(expected)}"

    def layout_problems(self, node: Mapping[str, Any]) -> list[str]:
        """Shapes this architecture's config cannot describe (a head width, a dense layer pattern)."""
        return []

    def exported_names(self, node: Mapping[str, Any]) -> set[str]:
        """The curryTrain weights to_hf writes; any other weight of the model would be dropped."""
        names = {ours for ours, _ in self.weight_names(node)}
        return names | {name for fused in self.fused(node) for name in fused.ours}

    def hf_kwargs(self, node: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = decoder_hf_kwargs(node)
        if self.windows == "all":
            kwargs["sliding_window"] = node.get("sliding_window") or None
        elif self.windows == "layers":
            kwargs.update(sliding_window=node.get("sliding_window") or None, layer_types=hf_layer_types(node))
        if self.rope_per_layer_type:
            kwargs.update(per_layer_type_rope_hf(node))
            kwargs.pop("rope_scaling")
        return kwargs

    def to_hf(self, state: Mapping[str, torch.Tensor], node: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        tensors = {theirs: state[ours] for ours, theirs in self.weight_names(node)}
        for fused in self.fused(node):
            tensors[fused.theirs] = torch.cat([state[name] for name in fused.ours])
        return tensors


def _sizes(node: Mapping[str, Any]) -> dict[str, Any]:
    """The size fields mechanism() needs to normalise a family's defaults against the node."""
    return {key: node[key] for key in ("dim", "n_heads", "n_layers", "head_dim") if key in node}


@dataclasses.dataclass(frozen=True)
class QwenFamily(Family):
    """Qwen2/Qwen3: sliding windows switched on by use_sliding_window, on the layers from max_window_layers on
    (transformers derives layer_types from them; export writes all three, so any layer pattern loads)."""

    def hf_kwargs(self, node: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = super().hf_kwargs(node)
        kinds = layer_kinds(node)
        sliding = "sliding" in kinds
        kwargs.update(use_sliding_window=sliding, max_window_layers=kinds.index("sliding") if sliding else node["n_layers"])
        kwargs["sliding_window"] = node.get("sliding_window") or None if sliding else None
        return kwargs
