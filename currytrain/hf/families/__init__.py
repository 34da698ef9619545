"""Each supported Hugging Face architecture, by its transformers class name: the registry import and
export select a family from. Import selects by the checkpoint's `architectures`; export by the class the
model node builds and its explicit fields (qkv_bias, qk_norm). A new family is a module beside these
(a Family subclass when its weights or routing differ from the dense decoder's) and one entry below."""

from __future__ import annotations

import importlib
from typing import Any

from currytrain.build import target_problem
from currytrain.hf.families.base import Family
from currytrain.hf.families.mixtral import MixtralFamily
from currytrain.model.gqa import GQATransformer
from currytrain.model.moe import MoETransformer

FAMILIES: dict[str, Family] = {
    family.architecture: family
    for family in (
        Family("LlamaForCausalLM", "LlamaConfig", "llama"),
        Family("Qwen2ForCausalLM", "Qwen2Config", "qwen2", qkv_bias=True),
        Family("Qwen3ForCausalLM", "Qwen3Config", "qwen3", qk_norm=True),
        Family("MistralForCausalLM", "MistralConfig", "mistral", windowed=True),
        MixtralFamily("MixtralForCausalLM", "MixtralConfig", "mixtral"),
    )
}


def _model_class(target: str) -> type | None:
    """The class a model node's _target_ names, or None. Like build(), imports nothing outside its allow-list."""
    module, _, name = target.rpartition(".")
    if not module or target_problem(target) is not None:
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) else None


def family_for_model(node: dict[str, Any], prefer: str | None = None) -> Family | str:
    """The architecture a curryTrain model node exports to, or why there is none. prefer: the architecture
    an import came from, kept when it represents the node too (a Mistral without a window is also a Llama)."""
    target = str(node.get("_target_", ""))
    model_class = _model_class(target)
    # Identity, not issubclass: a subclass may change forward(), and export promises transformers' logits.
    if model_class is GQATransformer:
        if node.get("qk_norm"):
            if node.get("qkv_bias"):
                return "model.qkv_bias=true with model.qk_norm=true has no transformers counterpart (Qwen3 biases o_proj as well)"
            return FAMILIES["Qwen3ForCausalLM"]
        if node.get("qkv_bias"):
            return FAMILIES["Qwen2ForCausalLM"]
        windowed = node.get("sliding_window") or prefer == "MistralForCausalLM"
        return FAMILIES["MistralForCausalLM" if windowed else "LlamaForCausalLM"]
    if model_class is MoETransformer:
        return FAMILIES["MixtralForCausalLM"]
    return f"model._target_={target} has no Hugging Face counterpart; export supports model=gqa and model=moe"
