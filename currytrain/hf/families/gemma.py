"""Gemma, Gemma 2 and Gemma 3 (text): model=gqa with unit-offset RMSNorms (1 + weight), embeddings scaled by
sqrt(dim) and a GeGLU MLP; Gemma 2 adds norms after attention and the MLP (norm_position=sandwich), soft-capped
attention scores and logits, query_pre_attn_scalar and alternating sliding and full layers; Gemma 3 adds
per-head qk-norm and a RoPE of its own for the sliding layers. The weights are a renaming (base.NORM_NAMES)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from currytrain.hf.families.base import HF_ACTIVATIONS, Family, head_width


@dataclasses.dataclass(frozen=True)
class GemmaFamily(Family):
    """The Gemma generations; which of the Gemma 2/3 fields a generation carries is its `free` set."""

    def problems(self, hf: Any) -> list[str]:
        problems = super().problems(hf)
        if getattr(hf, "use_bidirectional_attention", False):
            problems.append("use_bidirectional_attention=true: curryTrain's decoders attend causally")
        return problems

    def model_node(self, hf: Any) -> dict[str, Any]:
        node = super().model_node(hf)
        scalar = getattr(hf, "query_pre_attn_scalar", None)
        if "attn_scale" in self.free and scalar and not math.isclose(scalar, head_width(node)):
            node["attn_scale"] = float(scalar) ** -0.5
        for ours, theirs in (("attn_softcap", "attn_logit_softcapping"), ("logit_softcap", "final_logit_softcapping")):
            if ours in self.free and getattr(hf, theirs, None):
                node[ours] = float(getattr(hf, theirs))
        return node

    def hf_kwargs(self, node: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = super().hf_kwargs(node)
        # Gemma 1's config names the activation hidden_act, Gemma 2/3's hidden_activation.
        kwargs["hidden_activation"] = kwargs["hidden_act"] = HF_ACTIVATIONS[node.get("mlp_activation", "silu")]
        if "attn_scale" in self.free:
            scale = node.get("attn_scale") or 0.0
            scalar = scale**-2 if scale else head_width(node)
            kwargs["query_pre_attn_scalar"] = round(scalar) if math.isclose(scalar, round(scalar), rel_tol=1e-12) else scalar
        if "attn_softcap" in self.free:
            kwargs["attn_logit_softcapping"] = node.get("attn_softcap") or None
            kwargs["final_logit_softcapping"] = node.get("logit_softcap") or None
        return kwargs
