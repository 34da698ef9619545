"""What every Hugging Face family mapping shares, and the dense Llama-family decoder's mapping itself.

A Family turns a transformers config into a curryTrain model node (import) and back (export), lists
what it cannot represent exactly, and renames weights in both directions. The families with their own
weights or routing (Mixtral) subclass it in a module of their own beside this one; the registry
(currytrain.hf.families) lists every family.

RoPE: curryTrain pairs channel i with i + head_dim/2 ("rotate half"), as transformers does, so the
q/k projection rows are copied unpermuted (the parity tests in tests/test_hf.py hold this to 1e-5).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from currytrain.model.config import GQAConfig

# Buffers some older checkpoints still store; derived from the config, never weights.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)

Reader = Callable[[str], torch.Tensor]

# transformers' rope_type -> model.rope_scaling, and the scaling keys -> the model.rope_* fields.
ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3", "yarn": "yarn", "dynamic": "dynamic"}
ROPE_KEYS = {
    "factor": "rope_factor",
    "low_freq_factor": "rope_low_freq_factor",
    "high_freq_factor": "rope_high_freq_factor",
    "original_max_position_embeddings": "rope_original_max_seq_len",
    "beta_fast": "rope_beta_fast",
    "beta_slow": "rope_beta_slow",
    "attention_factor": "rope_attention_factor",
    "truncate": "rope_truncate",
}
ROPE_FIELDS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "truncate"),
    "dynamic": ("factor",),
}


# ---------------------------------------------------------------------------------------------- config


def _rope(hf: Any) -> tuple[float, dict[str, Any]]:
    """(theta, scaling) from a transformers config: v5 keeps both in rope_parameters, v4 in rope_theta/rope_scaling."""
    params = getattr(hf, "rope_parameters", None)
    if isinstance(params, dict):
        extra = {k: v for k, v in params.items() if k != "rope_theta" and not (k == "rope_type" and v == "default")}
        return float(params.get("rope_theta", 10000.0)), extra
    return float(getattr(hf, "rope_theta", 10000.0)), dict(getattr(hf, "rope_scaling", None) or {})


def decoder_problems(hf: Any) -> list[str]:
    """What every supported architecture shares and curryTrain's decoder cannot represent otherwise."""
    problems = []
    heads, hidden = hf.num_attention_heads, hf.hidden_size
    act = getattr(hf, "hidden_act", "silu")
    if act != "silu":
        problems.append(f"hidden_act={act}: curryTrain's SwiGLU uses silu")
    if hidden % heads and not getattr(hf, "head_dim", None):
        problems.append(f"hidden_size={hidden} is not divisible by num_attention_heads={heads} and head_dim is not set")
    _, scaling = _rope(hf)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        problems.append(
            f"rope scaling rope_type={kind} {scaling}: not supported, curryTrain implements rope_type default, linear, llama3 "
            "(Llama 3.1-3.3), yarn and dynamic; longrope and the others are not converted approximately"
        )
    if getattr(hf, "partial_rotary_factor", 1.0) not in (None, 1.0):
        problems.append(f"partial_rotary_factor={hf.partial_rotary_factor}: curryTrain rotates the full head dimension")
    if getattr(hf, "quantization_config", None):
        problems.append("quantization_config is set: import an unquantized checkpoint")
    return problems


def window_node(hf: Any) -> dict[str, Any]:
    """model.sliding_window of a config whose window covers every layer (Mistral, Mixtral); null: full context."""
    window = getattr(hf, "sliding_window", None)
    return {"sliding_window": int(window)} if window else {}


def sliding_problems(hf: Any) -> list[str]:
    layer_types = getattr(hf, "layer_types", None) or []
    if getattr(hf, "use_sliding_window", False) or "sliding_attention" in layer_types:
        return [f"sliding-window attention (sliding_window={hf.sliding_window}): curryTrain attends over the full causal context"]
    return []


def _head_dim(hf: Any) -> int:
    """head_dim when the config sets one that differs from hidden_size / heads, else 0 (derived)."""
    head_dim = getattr(hf, "head_dim", None)
    return int(head_dim) if head_dim and head_dim * hf.num_attention_heads != hf.hidden_size else 0


def rope_node(hf: Any) -> dict[str, Any]:
    """The model.rope_* fields of a config's RoPE scaling (none: the fields keep their defaults)."""
    _, scaling = _rope(hf)
    kind = ROPE_TYPES[scaling.get("rope_type", scaling.get("type", "default"))]
    if kind == "none":
        return {}
    if kind == "yarn":
        return {"rope_scaling": kind, **yarn_node(hf, scaling)}
    if kind == "dynamic":  # transformers measures the growth against max_position_embeddings
        return {"rope_scaling": kind, "rope_factor": float(scaling["factor"]), "rope_original_max_seq_len": int(hf.max_position_embeddings)}
    fields = {ROPE_KEYS[key]: float(scaling[key]) for key in ROPE_FIELDS[kind]}
    if "rope_original_max_seq_len" in fields:  # a token count
        fields["rope_original_max_seq_len"] = int(fields["rope_original_max_seq_len"])
    return {"rope_scaling": kind, **fields}


def decoder_node(hf: Any, target: str) -> dict[str, Any]:
    theta, _ = _rope(hf)
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
    if head_dim := _head_dim(hf):
        node["head_dim"] = head_dim
    return {**node, **rope_node(hf)}


def yarn_node(hf: Any, scaling: dict[str, Any]) -> dict[str, Any]:
    """The model.rope_* fields of a yarn scaling, every default transformers fills in made explicit: the
    factor (DeepSeek leaves it out: max_position_embeddings / the original), beta_fast/slow, the attention
    factor (from mscale/mscale_all_dim when given), truncate."""
    original = int(scaling["original_max_position_embeddings"])
    factor = float(scaling.get("factor") or hf.max_position_embeddings / original)

    def temperature(scale: float) -> float:
        return 0.1 * scale * math.log(factor) + 1.0 if factor > 1 else 1.0

    attention = scaling.get("attention_factor")
    if attention is None and scaling.get("mscale") and scaling.get("mscale_all_dim"):
        attention = temperature(scaling["mscale"]) / temperature(scaling["mscale_all_dim"])
    return {
        "rope_factor": factor,
        "rope_original_max_seq_len": original,
        "rope_beta_fast": float(scaling.get("beta_fast") or 32),
        "rope_beta_slow": float(scaling.get("beta_slow") or 1),
        "rope_attention_factor": float(attention if attention is not None else temperature(1.0)),
        "rope_truncate": bool(scaling.get("truncate", True)),
    }


def rope_hf(node: dict[str, Any]) -> dict[str, Any]:
    """transformers' RoPE parameters of a model node (v5 reads rope_parameters, v4 rope_theta + rope_scaling)."""
    kind = node.get("rope_scaling", "none")
    params = {"rope_type": "default" if kind == "none" else kind, "rope_theta": node["rope_theta"]}
    params.update({key: node[ROPE_KEYS[key]] for key in ROPE_FIELDS.get(kind, ())})
    return {"rope_parameters": params, "rope_theta": node["rope_theta"], "rope_scaling": None if kind == "none" else params}


def decoder_hf_kwargs(node: dict[str, Any]) -> dict[str, Any]:
    return {
        "vocab_size": node["vocab_size"],
        "hidden_size": node["dim"],
        "num_hidden_layers": node["n_layers"],
        "num_attention_heads": node["n_heads"],
        "num_key_value_heads": node["n_kv_heads"],
        "head_dim": node.get("head_dim") or node["dim"] // node["n_heads"],
        "intermediate_size": node["mlp_hidden"],
        # Dynamic RoPE scales against max_position_embeddings: it must be the original context, not a longer max_seq_len.
        "max_position_embeddings": node["rope_original_max_seq_len"] if node.get("rope_scaling") == "dynamic" else node["max_seq_len"],
        "rms_norm_eps": node["norm_eps"],
        "tie_word_embeddings": node["tie_embeddings"],
        "initializer_range": node["init_std"],
        "hidden_act": "silu",
        **rope_hf(node),
    }


# ---------------------------------------------------------------------------------------------- weights


def attention_names(node: dict[str, Any], i: int) -> list[tuple[str, str]]:
    ours, theirs = f"layers.{i}.", f"model.layers.{i}."
    pairs = [(f"{ours}attention_norm.weight", f"{theirs}input_layernorm.weight")]
    for our, hf in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
        pairs.append((f"{ours}attention.{our}.weight", f"{theirs}self_attn.{hf}.weight"))
        if node.get("qkv_bias") and our != "wo":
            pairs.append((f"{ours}attention.{our}.bias", f"{theirs}self_attn.{hf}.bias"))
    if node.get("qk_norm"):
        pairs += [(f"{ours}attention.{n}.weight", f"{theirs}self_attn.{n}.weight") for n in ("q_norm", "k_norm")]
    pairs.append((f"{ours}mlp_norm.weight", f"{theirs}post_attention_layernorm.weight"))
    return pairs


def outer_names(node: dict[str, Any]) -> list[tuple[str, str]]:
    pairs = [("tok_embeddings.weight", "model.embed_tokens.weight"), ("norm.weight", "model.norm.weight")]
    if not node["tie_embeddings"]:  # tied: transformers stores only the embedding
        pairs.append(("output.weight", "lm_head.weight"))
    return pairs


@dataclasses.dataclass(frozen=True)
class Family:
    """A dense Llama-family decoder: the weights are a one-to-one renaming."""

    architecture: str
    """transformers class name, the config's `architectures` entry."""
    config_class: str
    """transformers config class that export instantiates."""
    model_type: str
    """The config's model_type; selects the family when a config.json lists no architectures."""
    qkv_bias: bool = False
    """The architecture always has q/k/v biases (Qwen2)."""
    qk_norm: bool = False
    """The architecture has per-head q/k RMSNorm (Qwen3)."""
    windowed: bool = False
    """The config's sliding_window applies to every layer (Mistral): it becomes model.sliding_window."""

    # -- import

    def problems(self, hf: Any) -> list[str]:
        problems = decoder_problems(hf) + ([] if self.windowed else sliding_problems(hf))
        if getattr(hf, "attention_bias", False):
            problems.append("attention_bias=true: curryTrain's attention has no output-projection bias")
        if getattr(hf, "mlp_bias", False):
            problems.append("mlp_bias=true: curryTrain's SwiGLU has no biases")
        return problems

    def model_node(self, hf: Any) -> dict[str, Any]:
        node = {**decoder_node(hf, GQAConfig._target_), "qkv_bias": self.qkv_bias, "qk_norm": self.qk_norm}
        return {**node, **window_node(hf)} if self.windowed else node

    def exported_names(self, node: dict[str, Any]) -> set[str]:
        """The curryTrain weights to_hf writes; any other weight of the model would be dropped."""
        return {ours for ours, _ in self.weight_names(node)}

    def weight_names(self, node: dict[str, Any]) -> list[tuple[str, str]]:
        """(curryTrain name, transformers name) of every weight."""
        pairs = outer_names(node)
        for i in range(node["n_layers"]):
            pairs += attention_names(node, i)
            pairs += [
                (f"layers.{i}.mlp.w1.weight", f"model.layers.{i}.mlp.gate_proj.weight"),
                (f"layers.{i}.mlp.w3.weight", f"model.layers.{i}.mlp.up_proj.weight"),
                (f"layers.{i}.mlp.w2.weight", f"model.layers.{i}.mlp.down_proj.weight"),
            ]
        return pairs

    def to_currytrain(self, read: Reader, available: set[str], node: dict[str, Any]) -> tuple[dict[str, torch.Tensor], set[str], list[str]]:
        """(state in curryTrain names, transformers names used, transformers names missing)."""
        state, used, missing = {}, set(), []
        for ours, theirs in self.weight_names(node):
            if theirs in available:
                state[ours] = read(theirs)
                used.add(theirs)
            else:
                missing.append(theirs)
        return state, used, missing

    # -- export

    def export_problems(self, node: dict[str, Any]) -> list[str]:
        if node.get("sliding_window") and not self.windowed:
            return [f"model.sliding_window={node['sliding_window']}: {self.architecture} has no sliding window over every layer"]
        return []

    def hf_kwargs(self, node: dict[str, Any]) -> dict[str, Any]:
        kwargs = decoder_hf_kwargs(node)
        return {**kwargs, "sliding_window": node.get("sliding_window") or None} if self.windowed else kwargs

    def to_hf(self, state: dict[str, torch.Tensor], node: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {theirs: state[ours] for ours, theirs in self.weight_names(node)}
