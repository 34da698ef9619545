"""DeepSeek-V3 (and Moonlight/Kimi-shaped checkpoints that load as DeepseekV3ForCausalLM): model=moe with
multi-head latent attention (model.kv_lora_rank, q_lora_rank, rope_dim, v_head_dim), YaRN with mscale, shared
experts, sigmoid routing with the bias-corrected, group-limited top-k (router_bias, router_groups,
router_group_top_k, routed_scale) and the first dense layers (dense_layers, dense_hidden).

DeepSeek lays each head's RoPE channels out as interleaved pairs (x0, x1), (x2, x3), ... (rope_interleave);
curryTrain pairs channel i with i + rope_dim/2. A rotation acts the same on both once the rows that produce those
channels (the RoPE rows of q_proj/q_b_proj and of kv_a_proj_with_mqa) are reordered evens-then-odds, which
import does and export undoes: q.k is unchanged, since queries and keys are permuted alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from currytrain.hf.families.base import Reader, head_width, mlp_names, norm_names, rope_parameters, yarn_temperature
from currytrain.hf.families.moe import MoEFamily

LATENT_NORM_EPS = 1e-6
"""transformers builds DeepSeek's q_a/kv_a latent norms with this eps whatever rms_norm_eps says."""


def interleaved_to_halves(rope_dim: int) -> torch.Tensor:
    """The row order that turns interleaved RoPE pairs into rotate-half ones: evens, then odds."""
    return torch.cat([torch.arange(0, rope_dim, 2), torch.arange(1, rope_dim, 2)])


@dataclasses.dataclass(frozen=True)
class DeepseekV3Family(MoEFamily):
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"gating": "sigmoid", "router_bias": True})
    free: frozenset[str] = frozenset(
        {
            "kv_lora_rank",
            "q_lora_rank",
            "v_head_dim",
            "rope_dim",
            "attn_scale",
            "renormalize",
            "shared_expert",
            "dense_layers",
            "dense_hidden",
            "router_groups",
            "router_group_top_k",
            "routed_scale",
        }
    )

    # -- import

    def problems(self, hf: Any) -> list[str]:
        problems = super().problems(hf)
        if hf.num_key_value_heads != hf.num_attention_heads:
            problems.append(f"num_key_value_heads={hf.num_key_value_heads}: latent attention expands keys and values per head ({hf.num_attention_heads})")
        if hf.rms_norm_eps != LATENT_NORM_EPS:
            problems.append(f"rms_norm_eps={hf.rms_norm_eps}: transformers' latent norms use {LATENT_NORM_EPS} whatever it says; curryTrain's use rms_norm_eps")
        if not getattr(hf, "rope_interleave", True):
            problems.append("rope_interleave=false: curryTrain maps DeepSeek's interleaved RoPE layout only")
        groups = getattr(hf, "n_group", None) or 1
        if hf.n_routed_experts % groups:
            problems.append(f"n_group={groups} does not divide n_routed_experts={hf.n_routed_experts}")
        for key, value in (("moe_layer_freq", 1), ("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
            if getattr(hf, key, value) != value:
                problems.append(f"{key}={getattr(hf, key)}: curryTrain's DeepSeek-V3 mapping has {key}={value}")
        return problems

    def model_node(self, hf: Any) -> dict[str, Any]:
        node = self.base_node(hf)
        head, rope_dim = int(hf.qk_nope_head_dim + hf.qk_rope_head_dim), int(hf.qk_rope_head_dim)
        node.pop("head_dim", None)  # transformers' head_dim is the RoPE width here
        if head * node["n_heads"] != node["dim"]:
            node["head_dim"] = head
        v_head_dim = int(hf.v_head_dim or head)
        node.update(n_kv_heads=node["n_heads"], rope_dim=rope_dim, kv_lora_rank=int(hf.kv_lora_rank), q_lora_rank=int(hf.q_lora_rank or 0))
        node["v_head_dim"] = v_head_dim if v_head_dim != head else 0
        params = rope_parameters(hf)
        if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
            node["attn_scale"] = head**-0.5 * yarn_temperature(float(params["factor"]), float(params["mscale_all_dim"])) ** 2
        shared = int(getattr(hf, "n_shared_experts", 0) or 0)
        node.update(
            num_experts=int(hf.n_routed_experts),
            top_k=int(hf.num_experts_per_tok),
            expert_hidden=int(hf.moe_intermediate_size),
            renormalize=bool(hf.norm_topk_prob),
            router_groups=int(getattr(hf, "n_group", None) or 1),
            router_group_top_k=int(getattr(hf, "topk_group", None) or 1),
            routed_scale=float(hf.routed_scaling_factor),
            shared_expert=shared > 0,
            mlp_hidden=int(hf.moe_intermediate_size) * shared if shared else int(hf.intermediate_size),
            dense_layers=list(range(min(int(getattr(hf, "first_k_dense_replace", 0) or 0), node["n_layers"]))),
        )
        if node["dense_layers"] and node["mlp_hidden"] != hf.intermediate_size:
            node["dense_hidden"] = int(hf.intermediate_size)
        return node

    def ignored(self, name: str, node: Mapping[str, Any]) -> bool:
        """Also the multi-token-prediction layers (model.layers.{n_layers + k}), which transformers does not run."""
        parts = name.split(".")
        beyond = len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit() and int(parts[2]) >= node["n_layers"]
        return beyond or super().ignored(name, node)

    # -- weights

    def layer_names(self, node: Mapping[str, Any], i: int) -> list[tuple[str, str]]:
        ours, theirs = f"layers.{i}.attention.", f"model.layers.{i}.self_attn."
        if node.get("q_lora_rank"):
            queries = [("wq_a", "q_a_proj"), ("q_a_norm", "q_a_layernorm"), ("wq_b", "q_b_proj")]
        else:
            queries = [("wq", "q_proj")]
        latent = [("wkv_a", "kv_a_proj_with_mqa"), ("kv_a_norm", "kv_a_layernorm"), ("wkv_b", "kv_b_proj"), ("wo", "o_proj")]
        pairs = norm_names(node, i) + [(f"{ours}{a}.weight", f"{theirs}{b}.weight") for a, b in queries + latent]
        return pairs + (mlp_names(i) if i not in self.moe_layers(node) else [])

    def sparse_names(self, node: Mapping[str, Any], i: int) -> list[tuple[str, str]]:
        pairs = super().sparse_names(node, i) + [(f"layers.{i}.moe.router.expert_bias", f"model.layers.{i}.mlp.gate.e_score_correction_bias")]
        return pairs + (mlp_names(i, "moe.shared_expert", "mlp.shared_experts") if node.get("shared_expert") else [])

    def _rope_rows(self, node: Mapping[str, Any], i: int) -> list[tuple[str, torch.Tensor]]:
        """(curryTrain weight, the indices of its RoPE rows): each head's last rope_dim query rows, the last rope_dim
        rows of the latent key projection."""
        head, rope_dim = head_width(node), node["rope_dim"]
        query = f"layers.{i}.attention.{'wq_b' if node.get('q_lora_rank') else 'wq'}.weight"
        heads = torch.arange(node["n_heads"])[:, None] * head + (head - rope_dim) + torch.arange(rope_dim)[None, :]
        return [(query, heads.flatten()), (f"layers.{i}.attention.wkv_a.weight", node["kv_lora_rank"] + torch.arange(rope_dim))]

    def reorder_rope_rows(self, state: dict[str, torch.Tensor], node: Mapping[str, Any], to_hf: bool) -> None:
        """In place: the RoPE rows of each query head and of the latent key, interleaved pairs -> evens then odds
        (import), or back (to_hf)."""
        order = interleaved_to_halves(node["rope_dim"])
        order = torch.argsort(order) if to_hf else order
        for i in range(node["n_layers"]):
            for name, rows in self._rope_rows(node, i):
                if name in state:
                    weight = state[name].clone()
                    groups = rows.view(-1, node["rope_dim"])
                    weight[groups.flatten()] = state[name][groups[:, order].flatten()]
                    state[name] = weight

    def to_currytrain(self, read: Reader, available: set[str], node: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], set[str], list[str]]:
        state, used, missing = super().to_currytrain(read, available, node)
        self.reorder_rope_rows(state, node, to_hf=False)
        return state, used, missing

    def to_hf(self, state: Mapping[str, torch.Tensor], node: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        ours = dict(state)
        self.reorder_rope_rows(ours, node, to_hf=True)
        return super().to_hf(ours, node)

    # -- export

    def layout_problems(self, node: Mapping[str, Any]) -> list[str]:
        problems = []
        if not node.get("kv_lora_rank"):
            problems.append("model.kv_lora_rank=0: DeepSeek-V3 attends through multi-head latent attention (kv_lora_rank > 0)")
        dense = sorted(node.get("dense_layers") or [])
        if dense != list(range(len(dense))):
            problems.append(f"model.dense_layers={dense}: DeepSeek-V3's dense layers are its first ones (first_k_dense_replace)")
        if node.get("shared_expert") and node["mlp_hidden"] % node["expert_hidden"]:
            problems.append(
                f"model.mlp_hidden={node['mlp_hidden']}: DeepSeek-V3's shared experts are n_shared_experts x model.expert_hidden={node['expert_hidden']} wide"
            )
        if node.get("norm_eps") != LATENT_NORM_EPS:
            problems.append(f"model.norm_eps={node.get('norm_eps')}: transformers' DeepSeek-V3 latent norms use {LATENT_NORM_EPS}")
        if node.get("attn_scale") and not math.isclose(node["attn_scale"], head_width(node) ** -0.5, rel_tol=1e-12) and not self._mscale_all_dim(node):
            problems.append(
                f"model.attn_scale={node['attn_scale']}: DeepSeek-V3 scales attention by 1/sqrt(head_dim), times YaRN's mscale_all_dim temperature "
                "(model.rope_scaling=yarn with model.rope_factor > 1 and an attn_scale above 1/sqrt(head_dim))"
            )
        return problems

    def _mscale_all_dim(self, node: Mapping[str, Any]) -> float | None:
        """The mscale_all_dim whose temperature squared turns 1/sqrt(head_dim) into model.attn_scale (YaRN only)."""
        factor = node.get("rope_factor", 1.0)
        if node.get("rope_scaling") != "yarn" or not factor > 1 or not node.get("attn_scale"):
            return None
        temperature = math.sqrt(node["attn_scale"] * math.sqrt(head_width(node)))
        return (temperature - 1) / (0.1 * math.log(factor)) if temperature > 1 else None

    def hf_kwargs(self, node: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = super().hf_kwargs(node)
        kwargs.pop("head_dim")  # DeepseekV3Config derives it (the RoPE width)
        head, rope_dim = head_width(node), node["rope_dim"]
        kwargs.update(
            num_key_value_heads=node["n_heads"],
            qk_rope_head_dim=rope_dim,
            qk_nope_head_dim=head - rope_dim,
            v_head_dim=node.get("v_head_dim") or head,
            kv_lora_rank=node["kv_lora_rank"],
            q_lora_rank=node.get("q_lora_rank") or None,
            n_routed_experts=node["num_experts"],
            moe_intermediate_size=node["expert_hidden"],
            n_shared_experts=node["mlp_hidden"] // node["expert_hidden"] if node.get("shared_expert") else 0,
            intermediate_size=node.get("dense_hidden") or node["mlp_hidden"],
            first_k_dense_replace=len(node.get("dense_layers") or []),
            n_group=node.get("router_groups", 1),
            topk_group=node.get("router_group_top_k", 1),
            routed_scaling_factor=node.get("routed_scale", 1.0),
            norm_topk_prob=node["renormalize"],
            rope_interleave=True,
        )
        if (mscale := self._mscale_all_dim(node)) is not None:
            kwargs["rope_parameters"].update(mscale=mscale, mscale_all_dim=mscale)
        return kwargs
