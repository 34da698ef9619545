"""The mixture-of-experts families on model=moe: Mixtral (softmax top-k in every layer) and Qwen3-MoE (the same
routing with norm_topk_prob, per-head qk-norm, and dense layers among the sparse ones).

curryTrain's model=moe stacks each layer's experts into three tensors at layers.{i}.moe.experts
(w1, w3: (num_experts, expert_hidden, dim); w2: (num_experts, dim, expert_hidden)) with the router at
layers.{i}.moe.router.gate. transformers writes its files with one matrix per expert (Mixtral:
block_sparse_moe.experts.{e}.w1/w2/w3; Qwen3-MoE, DeepSeek: mlp.experts.{e}.gate_proj/up_proj/down_proj);
transformers 5 fuses them into gate_up_proj/down_proj only in memory. Import reads both layouts; export
writes the per-expert one, which every version loads. A dense layer (model.dense_layers) is the dense
decoder's mlp.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from currytrain.hf.families.base import (
    MOE_DEFAULTS,
    Family,
    Reader,
    attention_names,
    decoder_hf_kwargs,
    decoder_node,
    describe,
    mlp_names,
    outer_names,
    window_node,
)
from currytrain.model.config import MoEConfig

EXPERT_WEIGHTS = ("w1", "w2", "w3")


@dataclasses.dataclass(frozen=True)
class MoEFamily(Family):
    """What the MoE families share: the experts' and routers' names, dense layers, routing refusals.

    moe_prefix: where transformers keeps a sparse layer's router and experts (block_sparse_moe, mlp);
    expert_names: its names of w1, w2, w3 inside each expert.
    """

    moe_prefix: str = "mlp"
    expert_names: tuple[str, str, str] = ("gate_proj", "down_proj", "up_proj")

    @property
    def target(self) -> str:
        return MoEConfig._target_

    @property
    def defaults(self) -> dict[str, Any]:
        return MOE_DEFAULTS

    def base_node(self, hf: Any) -> dict[str, Any]:
        """MoEConfig's defaults under the dense decoder's fields of `hf` and the family's fixed ones."""
        node = dict(MOE_DEFAULTS)
        node.update(decoder_node(hf, self.target))
        node.update(self.fixed)
        if self.windows != "none":
            node.update(window_node(hf))
        return node

    def moe_layers(self, node: Mapping[str, Any]) -> list[int]:
        dense = set(node.get("dense_layers") or ())
        return [i for i in range(node["n_layers"]) if i not in dense]

    def layer_names(self, node: Mapping[str, Any], i: int) -> list[tuple[str, str]]:
        """A layer's plainly renamed weights: norms and attention, and its MLP when it is dense."""
        dense = i not in self.moe_layers(node)
        return attention_names(node, i) + (mlp_names(i) if dense else [])

    def sparse_names(self, node: Mapping[str, Any], i: int) -> list[tuple[str, str]]:
        """A sparse layer's router, and the weights beside its experts (a shared expert, a routing bias)."""
        return [(f"layers.{i}.moe.router.gate.weight", f"model.layers.{i}.{self.moe_prefix}.gate.weight")]

    def weight_names(self, node: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The weights that are a plain renaming; the experts are handled by to_currytrain / to_hf."""
        pairs = outer_names(node)
        for i in range(node["n_layers"]):
            pairs += self.layer_names(node, i)
        for i in self.moe_layers(node):
            pairs += self.sparse_names(node, i)
        return pairs

    def to_currytrain(self, read: Reader, available: set[str], node: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], set[str], list[str]]:
        state, used, missing = super().to_currytrain(read, available, node)
        hidden = node["expert_hidden"]
        for i in self.moe_layers(node):
            ours, theirs = f"layers.{i}.moe.experts.", f"model.layers.{i}."
            fused = {"w13": theirs + "mlp.experts.gate_up_proj", "w2": theirs + "mlp.experts.down_proj"}
            if fused["w13"] in available:  # transformers 5's in-memory names
                names = list(fused.values())
            else:
                per_expert = {
                    ours_w: [f"{theirs}{self.moe_prefix}.experts.{e}.{theirs_w}.weight" for e in range(node["num_experts"])]
                    for ours_w, theirs_w in zip(EXPERT_WEIGHTS, self.expert_names)
                }
                names = [n for group in per_expert.values() for n in group]
            absent = [n for n in names if n not in available]
            if absent:
                missing += absent
                continue
            used |= set(names)
            if fused["w13"] in available:
                w13 = read(fused["w13"])
                state[ours + "w1"], state[ours + "w3"] = w13[:, :hidden].contiguous(), w13[:, hidden:].contiguous()
                state[ours + "w2"] = read(fused["w2"]).clone()
            else:
                for w, group in per_expert.items():
                    state[ours + w] = torch.stack([read(n) for n in group])
        return state, used, missing

    def exported_names(self, node: Mapping[str, Any]) -> set[str]:
        names = super().exported_names(node)
        return names | {f"layers.{i}.moe.experts.{w}" for i in self.moe_layers(node) for w in EXPERT_WEIGHTS}

    def mismatch(self, key: str, value: Any, expected: Any) -> str:
        short = self.architecture.removesuffix("ForCausalLM")
        if key == "shared_expert":
            return (
                f"model.shared_expert={describe(value)}: {short} has no shared expert, so transformers would drop it and compute other "
                "logits; only model.shared_expert=false exports (retrain without it)"
            )
        if key in ("gating", "renormalize", "capacity_factor", "router_bias", "router_groups", "router_group_top_k", "routed_scale"):
            return f"model.{key}={describe(value)}: {short} routes with {key}={describe(expected)}; retrain or export another way"
        if key in ("dense_layers", "dense_hidden"):
            return f"model.{key}={describe(value)}: every {short} layer is sparse ({key}={describe(expected)})"
        return super().mismatch(key, value, expected)

    def hf_kwargs(self, node: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = decoder_hf_kwargs(node)
        kwargs["num_experts_per_tok"] = node["top_k"]
        if self.windows != "none":
            kwargs["sliding_window"] = node.get("sliding_window") or None
        if "aux_loss_coef" in node:  # the load-balancing weight; transformers applies it with output_router_logits
            kwargs["router_aux_loss_coef"] = node["aux_loss_coef"]
        return kwargs

    def to_hf(self, state: Mapping[str, torch.Tensor], node: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        tensors = super().to_hf(state, node)
        for i in self.moe_layers(node):
            for ours_w, theirs_w in zip(EXPERT_WEIGHTS, self.expert_names):
                for e, matrix in enumerate(state[f"layers.{i}.moe.experts.{ours_w}"].unbind(0)):
                    tensors[f"model.layers.{i}.{self.moe_prefix}.experts.{e}.{theirs_w}.weight"] = matrix
        return tensors


@dataclasses.dataclass(frozen=True)
class MixtralFamily(MoEFamily):
    """Mixtral: the dense attention of the Llama family plus a top-k softmax MoE in every layer (routing:
    softmax over all experts, top-k, renormalised, dropless: MoEConfig's defaults)."""

    moe_prefix: str = "block_sparse_moe"
    expert_names: tuple[str, str, str] = ("w1", "w2", "w3")

    def model_node(self, hf: Any) -> dict[str, Any]:
        node = self.base_node(hf)
        node.update(num_experts=int(hf.num_local_experts), top_k=int(hf.num_experts_per_tok), expert_hidden=int(hf.intermediate_size))
        # The load-balancing loss weight the checkpoint was trained with, so a fine-tune keeps it.
        node["aux_loss_coef"] = float(getattr(hf, "router_aux_loss_coef", node["aux_loss_coef"]))
        return node

    def alias(self, name: str) -> str | None:
        # transformers 5 holds Mixtral's router at mlp.gate in memory: a file saved from that state names it so.
        return name.replace(".block_sparse_moe.gate.", ".mlp.gate.") if ".block_sparse_moe.gate." in name else None

    def hf_kwargs(self, node: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = super().hf_kwargs(node)
        kwargs.update(intermediate_size=node["expert_hidden"], num_local_experts=node["num_experts"])
        return kwargs


@dataclasses.dataclass(frozen=True)
class Qwen3MoeFamily(MoEFamily):
    """Qwen3-MoE: Qwen3's attention (per-head qk-norm), softmax top-k routing renormalised when norm_topk_prob,
    no shared expert, and dense layers of width intermediate_size: mlp_only_layers, and every layer i with
    (i + 1) % decoder_sparse_step != 0."""

    free: frozenset[str] = frozenset({"renormalize", "dense_layers", "dense_hidden"})

    def problems(self, hf: Any) -> list[str]:
        problems = super().problems(hf)
        if not getattr(hf, "num_experts", 0):
            problems.append("num_experts=0: a dense Qwen3 (import it as Qwen3ForCausalLM)")
        return problems

    def model_node(self, hf: Any) -> dict[str, Any]:
        node = self.base_node(hf)
        step, only = int(getattr(hf, "decoder_sparse_step", 1) or 1), set(getattr(hf, "mlp_only_layers", None) or ())
        dense = [i for i in range(node["n_layers"]) if i in only or (i + 1) % step]
        node.update(num_experts=int(hf.num_experts), top_k=int(hf.num_experts_per_tok), expert_hidden=int(hf.moe_intermediate_size))
        node.update(renormalize=bool(hf.norm_topk_prob), dense_layers=dense)
        node["aux_loss_coef"] = float(getattr(hf, "router_aux_loss_coef", node["aux_loss_coef"]))
        return node

    def hf_kwargs(self, node: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = super().hf_kwargs(node)
        kwargs.update(
            intermediate_size=node.get("dense_hidden") or node["mlp_hidden"],
            moe_intermediate_size=node["expert_hidden"],
            num_experts=node["num_experts"],
            norm_topk_prob=node["renormalize"],
            decoder_sparse_step=1,
            mlp_only_layers=sorted(node.get("dense_layers") or []),
            use_sliding_window=bool(node.get("sliding_window")),
        )
        return kwargs
