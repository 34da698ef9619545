"""Phi-3 (and Phi-3.5/Phi-4-mini, which load as Phi3ForCausalLM): model=gqa whose q/k/v and gate/up projections
transformers stores fused (qkv_proj, gate_up_proj): split on import, concatenated on export. Its RoPE is the
default or LongRoPE (the 128k variants: short and long factors), over all of each head or its first
partial_rotary_factor (model.rope_dim); a sliding window, when set, covers every layer."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from currytrain.hf.families.base import Family, Fused, attention_names, head_width, mlp_names, outer_names, rope_parameters


@dataclasses.dataclass(frozen=True)
class Phi3Family(Family):
    def problems(self, hf: Any) -> list[str]:
        problems = [p for p in super().problems(hf) if not p.startswith("partial_rotary_factor")]
        head = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        if head * hf.num_attention_heads != hf.hidden_size:
            problems.append(f"head_dim={head}: Phi-3's heads are hidden_size / num_attention_heads wide")
        return problems

    def model_node(self, hf: Any) -> dict[str, Any]:
        node = super().model_node(hf)
        factor = rope_parameters(hf).get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", 1.0)) or 1.0
        rotated = int(head_width(node) * factor)
        if rotated != head_width(node):
            node["rope_dim"] = rotated
        return node

    def weight_names(self, node: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Everything but the fused projections: embeddings, norms, o_proj, down_proj."""
        pairs = outer_names(node)
        for i in range(node["n_layers"]):
            pairs += [pair for pair in attention_names(node, i) if not pair[0].endswith(("wq.weight", "wk.weight", "wv.weight"))]
            pairs += [pair for pair in mlp_names(i) if pair[0].endswith("w2.weight")]
        return pairs

    def fused(self, node: Mapping[str, Any]) -> list[Fused]:
        q, kv = node["n_heads"] * head_width(node), node["n_kv_heads"] * head_width(node)
        fused = []
        for i in range(node["n_layers"]):
            ours, theirs = f"layers.{i}.", f"model.layers.{i}."
            fused.append(Fused(f"{theirs}self_attn.qkv_proj.weight", tuple(f"{ours}attention.{w}.weight" for w in ("wq", "wk", "wv")), (q, kv, kv)))
            fused.append(Fused(f"{theirs}mlp.gate_up_proj.weight", (f"{ours}mlp.w1.weight", f"{ours}mlp.w3.weight"), (node["mlp_hidden"],) * 2))
        return fused

    def layout_problems(self, node: Mapping[str, Any]) -> list[str]:
        if node.get("head_dim") and node["head_dim"] * node["n_heads"] != node["dim"]:
            return [f"model.head_dim={node['head_dim']}: Phi-3's heads are model.dim / model.n_heads = {node['dim'] // node['n_heads']} wide"]
        return []

    def hf_kwargs(self, node: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = super().hf_kwargs(node)
        kwargs.pop("head_dim")
        head, rotated = head_width(node), node.get("rope_dim") or head_width(node)
        # transformers rotates int(head_dim * partial_rotary_factor) channels: a factor that floors back to rope_dim.
        factor = rotated / head if int(head * (rotated / head)) == rotated else (rotated + 0.5) / head
        kwargs["rope_parameters"]["partial_rotary_factor"] = factor
        longrope = node.get("rope_scaling") == "longrope"
        kwargs["original_max_position_embeddings"] = node["rope_original_max_seq_len"] if longrope else kwargs["max_position_embeddings"]
        return kwargs
