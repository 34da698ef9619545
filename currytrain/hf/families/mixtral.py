"""Mixtral: the Llama family's dense attention with a top-k softmax mixture of experts in every layer."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from currytrain.hf.families.base import Family, Reader, attention_names, decoder_hf_kwargs, decoder_node, decoder_problems, outer_names, window_node
from currytrain.model.config import MoEConfig

# model=moe: the fields this mapping reads or sets besides DecoderConfig's (shared_expert: Mixtral has
# none), and the routing that equals Mixtral's (softmax over all experts, top-k, renormalised, dropless).
MOE_FIELDS = ("num_experts", "top_k", "expert_hidden", "shared_expert")
MIXTRAL_ROUTING = {"gating": "softmax", "renormalize": True, "capacity_factor": 0.0}


@dataclasses.dataclass(frozen=True)
class MixtralFamily(Family):
    """Mixtral: the dense attention of the Llama family plus a top-k softmax MoE in every layer.

    curryTrain's model=moe stacks each layer's experts into three tensors at layers.{i}.moe.experts
    (w1, w3: (num_experts, expert_hidden, dim); w2: (num_experts, dim, expert_hidden)) with the router
    at layers.{i}.moe.router.gate. transformers writes Mixtral files with one w1/w2/w3 matrix per
    expert under block_sparse_moe (the original layout; 5.x fuses w1|w3 into gate_up_proj only in
    memory). Import reads both layouts; export writes the per-expert one, which every version loads.
    """

    def problems(self, hf: Any) -> list[str]:
        return decoder_problems(hf)

    def model_node(self, hf: Any) -> dict[str, Any]:
        node = _moe_defaults()
        node.update(decoder_node(hf, node["_target_"]))
        node.update(window_node(hf))
        node.update(num_experts=int(hf.num_local_experts), top_k=int(hf.num_experts_per_tok), expert_hidden=int(hf.intermediate_size))
        node.update(MIXTRAL_ROUTING)
        # The load-balancing loss weight the checkpoint was trained with, so a fine-tune keeps it.
        node["aux_loss_coef"] = float(getattr(hf, "router_aux_loss_coef", node["aux_loss_coef"]))
        return node

    def weight_names(self, node: dict[str, Any]) -> list[tuple[str, str]]:
        """The weights that are a plain renaming; routers and experts are handled by to_currytrain / to_hf."""
        pairs = outer_names(node)
        for i in range(node["n_layers"]):
            pairs += attention_names(node, i)
        return pairs

    def to_currytrain(self, read: Reader, available: set[str], node: dict[str, Any]) -> tuple[dict[str, torch.Tensor], set[str], list[str]]:
        state, used, missing = super().to_currytrain(read, available, node)
        hidden = node["expert_hidden"]
        for i in range(node["n_layers"]):
            ours, theirs = f"layers.{i}.moe.", f"model.layers.{i}."
            fused = theirs + "mlp.experts.gate_up_proj" in available  # transformers 5.x in-memory names
            router = theirs + ("mlp.gate.weight" if fused else "block_sparse_moe.gate.weight")
            if fused:
                names = {"w13": theirs + "mlp.experts.gate_up_proj", "w2": theirs + "mlp.experts.down_proj"}
            else:
                names = {w: [f"{theirs}block_sparse_moe.experts.{e}.{w}.weight" for e in range(node["num_experts"])] for w in ("w1", "w2", "w3")}
            wanted = [router] + [n for v in names.values() for n in ([v] if isinstance(v, str) else v)]
            absent = [n for n in wanted if n not in available]
            if absent:
                missing += absent
                continue
            used |= set(wanted)
            state[ours + "router.gate.weight"] = read(router)
            if fused:
                w13 = read(names["w13"])
                state[ours + "experts.w1"], state[ours + "experts.w3"] = w13[:, :hidden].contiguous(), w13[:, hidden:].contiguous()
                state[ours + "experts.w2"] = read(names["w2"])
            else:
                for w, per_expert in names.items():
                    state[ours + f"experts.{w}"] = torch.stack([read(n) for n in per_expert])
        return state, used, missing

    def exported_names(self, node: dict[str, Any]) -> set[str]:
        names = super().exported_names(node)
        for i in range(node["n_layers"]):
            names |= {f"layers.{i}.moe.{w}" for w in ("router.gate.weight", "experts.w1", "experts.w2", "experts.w3")}
        return names

    def export_problems(self, node: dict[str, Any]) -> list[str]:
        problems = []
        for key, value in MIXTRAL_ROUTING.items():
            if node.get(key) != value:
                problems.append(f"model.{key}={node.get(key)}: Mixtral routes with {key}={value}; retrain or export another way")
        if node.get("shared_expert"):
            problems.append(
                "model.shared_expert=true: Mixtral has no shared expert, so transformers would drop it and compute other "
                "logits; only model.shared_expert=false exports (retrain without it)"
            )
        return problems

    def hf_kwargs(self, node: dict[str, Any]) -> dict[str, Any]:
        kwargs = decoder_hf_kwargs(node)
        kwargs.update(
            intermediate_size=node["expert_hidden"],
            num_local_experts=node["num_experts"],
            num_experts_per_tok=node["top_k"],
            sliding_window=node.get("sliding_window") or None,
        )
        if "aux_loss_coef" in node:  # the load-balancing weight; transformers applies it with output_router_logits
            kwargs["router_aux_loss_coef"] = node["aux_loss_coef"]
        return kwargs

    def to_hf(self, state: dict[str, torch.Tensor], node: dict[str, Any]) -> dict[str, torch.Tensor]:
        tensors = super().to_hf(state, node)
        for i in range(node["n_layers"]):
            tensors[f"model.layers.{i}.block_sparse_moe.gate.weight"] = state[f"layers.{i}.moe.router.gate.weight"]
            for w in ("w1", "w2", "w3"):
                for e, matrix in enumerate(state[f"layers.{i}.moe.experts.{w}"].unbind(0)):
                    tensors[f"model.layers.{i}.block_sparse_moe.experts.{e}.{w}.weight"] = matrix
        return tensors


def _moe_defaults() -> dict[str, Any]:
    """MoEConfig's defaults (model=moe); the mapping's own field names are checked against it."""
    node = dataclasses.asdict(MoEConfig())
    unknown = sorted((set(MOE_FIELDS) | set(MIXTRAL_ROUTING)) - set(node))
    assert not unknown, f"currytrain/hf/families/mixtral.py uses model=moe fields {unknown} that MoEConfig lacks: update MOE_FIELDS"
    return node
