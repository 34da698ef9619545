"""Each supported Hugging Face architecture, by its transformers class name: the registry import and export
select a family from. Import selects by the checkpoint's `architectures`; export by the class the model node
builds, then by its mechanism fields: the first family here (or the import's own) that computes exactly what
the node computes. A new family is a Family (or a subclass in a module beside these, when its weights or
config differ from the dense decoder's) and one entry below; docs/hf.md's table lists them."""

from __future__ import annotations

import importlib
from typing import Any

from currytrain.build import target_problem
from currytrain.hf.families.base import STANDARD_ROPE, Family, QwenFamily
from currytrain.hf.families.deepseek import DeepseekV3Family
from currytrain.hf.families.gemma import GemmaFamily
from currytrain.hf.families.moe import MixtralFamily, Qwen3MoeFamily
from currytrain.hf.families.phi3 import Phi3Family
from currytrain.model.gqa import GQATransformer
from currytrain.model.moe import MoETransformer

GEMMA = {"norm_unit_offset": True, "scale_embeddings": True}
OLMO2 = {"norm_position": "post", "qk_norm": True, "qk_norm_scope": "projection"}

FAMILIES: dict[str, Family] = {
    family.architecture: family
    for family in (
        # model=gqa, in the order export tries them
        Family("LlamaForCausalLM", "LlamaConfig", "llama"),
        Family("MistralForCausalLM", "MistralConfig", "mistral", windows="all"),
        QwenFamily("Qwen2ForCausalLM", "Qwen2Config", "qwen2", fixed={"qkv_bias": True}, windows="layers"),
        QwenFamily("Qwen3ForCausalLM", "Qwen3Config", "qwen3", fixed={"qk_norm": True}, windows="layers"),
        GemmaFamily("GemmaForCausalLM", "GemmaConfig", "gemma", fixed=GEMMA),
        GemmaFamily(
            "Gemma2ForCausalLM",
            "Gemma2Config",
            "gemma2",
            fixed={**GEMMA, "norm_position": "sandwich"},
            free=frozenset({"attn_scale", "attn_softcap", "logit_softcap"}),
            windows="layers",
        ),
        GemmaFamily(
            "Gemma3ForCausalLM",
            "Gemma3TextConfig",
            "gemma3_text",
            fixed={**GEMMA, "norm_position": "sandwich", "qk_norm": True},
            free=frozenset({"attn_scale", "attn_softcap", "logit_softcap"}),
            windows="layers",
            rope_per_layer_type=True,
        ),
        Phi3Family("Phi3ForCausalLM", "Phi3Config", "phi3", free=frozenset({"rope_dim"}), windows="all", rope_kinds=("none", "longrope")),
        Family("Olmo2ForCausalLM", "Olmo2Config", "olmo2", fixed=OLMO2),
        Family("Olmo3ForCausalLM", "Olmo3Config", "olmo3", fixed=OLMO2, windows="layers", rope_per_layer_type=True),
        # model=moe
        MixtralFamily("MixtralForCausalLM", "MixtralConfig", "mixtral", windows="all"),
        Qwen3MoeFamily("Qwen3MoeForCausalLM", "Qwen3MoeConfig", "qwen3_moe", fixed={"qk_norm": True}, windows="all"),
        DeepseekV3Family("DeepseekV3ForCausalLM", "DeepseekV3Config", "deepseek_v3", rope_kinds=STANDARD_ROPE),
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


def closest_family(node: dict[str, Any], prefer: str | None = None) -> tuple[Family | None, list[str]]:
    """The family a curryTrain model node exports to and why it cannot (empty: it can), or (None, [why]) when the
    node's class has none. prefer: the architecture an import came from, kept when it represents the node too
    (a Mistral without a window is also a Llama); otherwise the first family that fits, in registry order, or
    the one with the fewest problems."""
    target = str(node.get("_target_", ""))
    model_class = _model_class(target)
    # Identity, not issubclass: a subclass may change forward(), and export promises transformers' logits.
    if model_class not in (GQATransformer, MoETransformer):
        return None, [f"model._target_={target} has no Hugging Face counterpart; export supports model=gqa and model=moe"]
    candidates = [family for family in FAMILIES.values() if family.target == f"{model_class.__module__}.{model_class.__name__}"]
    if prefer in FAMILIES and FAMILIES[prefer] in candidates:
        candidates.insert(0, candidates.pop(candidates.index(FAMILIES[prefer])))
    ranked = [(family, family.export_problems(node)) for family in candidates]
    return min(ranked, key=lambda pair: len(pair[1]))


def family_for_model(node: dict[str, Any], prefer: str | None = None) -> Family | str:
    """The architecture a curryTrain model node exports to, or why there is none."""
    family, problems = closest_family(node, prefer)
    if family is None:
        return problems[0]
    if problems:
        return f"no transformers counterpart computes this model; {family.architecture} comes closest, but: " + "; ".join(problems)
    return family
