"""The Hugging Face bridge (currytrain hf import|export), against transformers itself, all offline.

Tiny random models (hidden 64, 2 layers, vocab 128) are saved by transformers, imported, compared
logit for logit, exported back and loaded by transformers again. Every weight is randomised, norms
and biases included, so a swapped or unmapped tensor cannot hide behind an init of ones or zeros.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("huggingface_hub")

from safetensors.torch import load_file, save_file  # noqa: E402

from conftest import ROOT, launch  # noqa: E402
from currytrain.errors import ConfigError  # noqa: E402
from currytrain.hf import export_hf, import_hf, load_model, read_model  # noqa: E402
from currytrain.hf.convert import SafetensorsReader, write_hf  # noqa: E402
from currytrain.hf.families import FAMILIES, family_for_model  # noqa: E402

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)

YARN_SCALING = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64)
YARN_SHORT = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16)
NO_IDS = dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)  # their defaults lie outside this vocabulary
DEEPSEEK = dict(
    num_key_value_heads=4,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    kv_lora_rank=16,
    q_lora_rank=24,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=12,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    n_shared_experts=2,
    routed_scaling_factor=2.5,
    **NO_IDS,
)
LLAMA3_SCALING = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16)

# case -> (architecture, config class, overrides): each case exercises what its family or shape adds.
CASES = {
    "LlamaForCausalLM": ("LlamaForCausalLM", "LlamaConfig", dict(rope_theta=500000.0, rms_norm_eps=1e-5)),
    "Qwen2ForCausalLM": ("Qwen2ForCausalLM", "Qwen2Config", dict(tie_word_embeddings=True, rope_theta=1e6)),  # q/k/v biases, tied head
    "Qwen3ForCausalLM": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=16)),  # per-head q/k norms
    "MixtralForCausalLM": ("MixtralForCausalLM", "MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    # Qwen3-0.6B's shape: head_dim (32) wider than hidden/heads (16), tied head.
    "qwen3-0.6b-shaped": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=32, tie_word_embeddings=True)),
    # Llama 3.2's: llama3 RoPE scaling (an original context of 16 so the ramp bends this small head's bands), tied head.
    "llama-3.2-shaped": ("LlamaForCausalLM", "LlamaConfig", dict(rope_theta=500000.0, tie_word_embeddings=True, rope_scaling=LLAMA3_SCALING)),
    "llama-linear-rope": ("LlamaForCausalLM", "LlamaConfig", dict(rope_scaling=dict(rope_type="linear", factor=4.0))),
    # Qwen3 with YaRN for long context: pairs 0-2 of this 8-pair head are kept, the rest interpolated, cos/sin x 1.14.
    "qwen3-yarn": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=16, rope_theta=10000.0, rope_scaling=YARN_SCALING)),
    # Dynamic NTK: an original context of 8 tokens, so the 16 test tokens rescale theta.
    "llama-dynamic-rope": ("LlamaForCausalLM", "LlamaConfig", dict(max_position_embeddings=8, rope_scaling=dict(rope_type="dynamic", factor=2.0))),
    # Mistral v0.1 attends over a sliding window (6 < the 16 test tokens and the 24 generated); v0.3 has none.
    "mistral-v0.1-shaped": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=6, head_dim=16)),
    "mistral-v0.3-shaped": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=None, head_dim=24)),
    "mixtral-windowed": ("MixtralForCausalLM", "MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=5)),
    # Qwen2 with use_sliding_window: full layers up to max_window_layers, sliding after (layer_types [full, sliding]).
    "qwen2-windowed": ("Qwen2ForCausalLM", "Qwen2Config", dict(use_sliding_window=True, sliding_window=6, max_window_layers=1)),
    # Gemma: GeGLU (gelu-tanh), RMSNorms of 1 + weight, embeddings x sqrt(dim), heads of 32 (wider than 64 / 4), tied head.
    "GemmaForCausalLM": ("GemmaForCausalLM", "GemmaConfig", dict(head_dim=32, **NO_IDS)),
    # Gemma 2: + norms after attention and MLP, soft-capped scores and logits (caps small enough to bend these
    # logits), query_pre_attn_scalar 24 != head_dim, sliding and full layers alternating (window 6 < 16 tokens).
    "Gemma2ForCausalLM": (
        "Gemma2ForCausalLM",
        "Gemma2Config",
        dict(head_dim=16, sliding_window=6, query_pre_attn_scalar=24, attn_logit_softcapping=1.0, final_logit_softcapping=2.0, **NO_IDS),
    ),
    # Gemma 3: + per-head qk-norm, two sliding layers per full one, a local RoPE theta for them and a linearly
    # scaled global one for the full layer.
    "Gemma3ForCausalLM": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        dict(
            head_dim=16,
            num_hidden_layers=3,
            sliding_window=6,
            sliding_window_pattern=3,
            rope_local_base_freq=100.0,
            rope_theta=1e6,
            rope_scaling=dict(rope_type="linear", factor=4.0),
            **NO_IDS,
        ),
    ),
    # Phi-3-mini-4k: fused qkv_proj and gate_up_proj, a window over every layer; here also half of each head rotated.
    "Phi3ForCausalLM": ("Phi3ForCausalLM", "Phi3Config", dict(sliding_window=6, partial_rotary_factor=0.5, **NO_IDS)),
    # Phi-3 128k: LongRoPE with short and long factors per channel pair (an original context of 12, so the 16 test
    # tokens use the long ones and generation crosses over), over the first 75% of each head (partial rotary).
    "phi3-128k-shaped": (
        "Phi3ForCausalLM",
        "Phi3Config",
        dict(
            original_max_position_embeddings=12,
            partial_rotary_factor=0.75,
            rope_scaling=dict(rope_type="longrope", short_factor=[1.0 + 0.3 * i for i in range(6)], long_factor=[2.0 + 1.5 * i for i in range(6)]),
            **NO_IDS,
        ),
    ),
    # OLMo 2: norms after attention and MLP only, qk-norm over each whole projection.
    "Olmo2ForCausalLM": ("Olmo2ForCausalLM", "Olmo2Config", dict(**NO_IDS)),
    # OLMo 3: OLMo 2 with three sliding layers per full one; YaRN on the full layer only.
    "Olmo3ForCausalLM": ("Olmo3ForCausalLM", "Olmo3Config", dict(num_hidden_layers=4, sliding_window=6, rope_scaling=YARN_SHORT, **NO_IDS)),
    # Qwen3-MoE: qk-norm, softmax top-2 of 4 renormalised (norm_topk_prob), a dense layer (mlp_only_layers) between sparse ones.
    "Qwen3MoeForCausalLM": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        dict(num_hidden_layers=3, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[1]),
    ),
    # decoder_sparse_step=2 makes every other layer dense; routing weights not renormalised.
    "qwen3-moe-sparse-step": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=2, norm_topk_prob=False),
    ),
    # DeepSeek-V3: latent attention (q and kv LoRA, 8 RoPE + 16 plain channels per q/k head, 12 per value head), YaRN
    # with mscale (cos/sin and the softmax scale), 8 experts in 4 groups of which each token keeps 2, sigmoid scores
    # with a correction bias, routed_scaling_factor, 2 shared experts, a first dense layer.
    "DeepseekV3ForCausalLM": (
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        dict(num_hidden_layers=3, **DEEPSEEK, rope_scaling=dict(YARN_SHORT, mscale=1.0, mscale_all_dim=0.8)),
    ),
    # Moonlight (Kimi): DeepseekV3ForCausalLM without a query LoRA, one group, one shared expert, no YaRN.
    "moonlight-shaped": (
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        dict(DEEPSEEK, q_lora_rank=None, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=2.446),
    ),
}
UNCACHED = ("dynamic", "longrope")
"""RoPE scalings whose tables depend on the whole input's length: transformers' KV cache keeps keys rotated for
earlier lengths, so only its uncached generation is the model's function of the whole sequence."""
NUM_NEW_TOKENS = 20


pytestmark = pytest.mark.usefixtures("one_thread")


def randomize_(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.1)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek's routing bias: a weight of the checkpoint
                buffer.normal_(0.0, 0.1)


def make_hf_model(name: str, **overrides) -> torch.nn.Module:
    architecture, config_class, case = CASES[name]
    config = getattr(transformers, config_class)(**{**TINY, **case, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).eval()
    randomize_(model)
    return model


def make_moe_model(**overrides) -> tuple[dict, torch.nn.Module]:
    """A model=moe node (MoEConfig's defaults at the TINY sizes) and the curryTrain model it builds, randomised."""
    from omegaconf import OmegaConf

    from currytrain.model import build_model
    from currytrain.model.config import MoEConfig

    sizes = dict(vocab_size=128, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=96, max_seq_len=64, expert_hidden=48)
    node = {**dataclasses.asdict(MoEConfig()), **sizes, **overrides}
    torch.manual_seed(0)
    model = build_model(OmegaConf.create(node)).eval()
    randomize_(model)
    return node, model


def greedy(model: torch.nn.Module, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """curryTrain's side of the greedy comparison: full forward each step, argmax of the last position."""
    tokens = prompt
    with torch.no_grad():
        for _ in range(steps):
            tokens = torch.cat([tokens, model(tokens)[:, -1:].argmax(-1)], dim=1)
    return tokens


def hf_greedy(model: torch.nn.Module, prompt: torch.Tensor, use_cache: bool = True) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=NUM_NEW_TOKENS, min_new_tokens=NUM_NEW_TOKENS, use_cache=use_cache
        )


def load_exported(folder: Path) -> torch.nn.Module:
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set(), info
    assert info["mismatched_keys"] == set() and not info["error_msgs"], info
    return model.eval()


TOKENS = torch.randint(0, TINY["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))


@dataclasses.dataclass
class Checkpoint:
    """A case's transformers model, saved (hf/) and imported (imported/), and transformers' logits of TOKENS."""

    reference: torch.nn.Module
    folder: Path
    logits: torch.Tensor

    @property
    def imported(self) -> Path:
        return self.folder / "imported"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """checkpoints(case) -> its Checkpoint, built and imported once per module (the parity test, the negative
    controls and the bad-input tests share them)."""
    root, built = tmp_path_factory.mktemp("checkpoints"), {}

    def get(case: str) -> Checkpoint:
        if case not in built:
            reference = make_hf_model(case)
            reference.save_pretrained(root / case / "hf")
            import_hf(str(root / case / "hf"), root / case / "imported")
            with torch.no_grad():
                built[case] = Checkpoint(reference, root / case, reference(TOKENS).logits)
        return built[case]

    return get


def tensors_of(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a folder's safetensors files (one file or shards), by name."""
    return {name: tensor for path in sorted(folder.glob("*.safetensors")) for name, tensor in load_file(path).items()}


@pytest.mark.parametrize("case", list(CASES))
def test_import_export_round_trip_matches_transformers(case, checkpoints, tmp_path):
    """Imported and exported logits within 1e-5 of transformers', the same 20 greedy tokens, and export -> import
    -> export writes the same tensors, byte for byte."""
    architecture = CASES[case][0]
    checkpoint = checkpoints(case)
    reference, expected = checkpoint.reference, checkpoint.logits
    ours = load_model(checkpoint.imported)
    with torch.no_grad():
        torch.testing.assert_close(ours(TOKENS), expected, atol=1e-5, rtol=0)

    export_hf(checkpoint.imported, tmp_path / "exported")
    exported = load_exported(tmp_path / "exported")
    assert type(exported).__name__ == architecture
    with torch.no_grad():
        torch.testing.assert_close(exported(TOKENS).logits, expected, atol=1e-5, rtol=0)

    prompt = TOKENS[:1, :4]
    uncached = CASES[case][2].get("rope_scaling", {}).get("rope_type") in UNCACHED
    reference_tokens = hf_greedy(reference, prompt, use_cache=not uncached)
    assert reference_tokens.shape[1] == 4 + NUM_NEW_TOKENS
    assert torch.equal(hf_greedy(exported, prompt, use_cache=not uncached), reference_tokens)
    assert torch.equal(greedy(ours, prompt, NUM_NEW_TOKENS), reference_tokens)

    import_hf(str(tmp_path / "exported"), tmp_path / "reimported")
    export_hf(tmp_path / "reimported", tmp_path / "again")
    first, second = tensors_of(tmp_path / "exported"), tensors_of(tmp_path / "again")
    assert first.keys() == second.keys() and first.keys() >= {n for n in tensors_of(checkpoint.folder / "hf")}
    for name, tensor in first.items():
        assert tensor.dtype == second[name].dtype and tensor.shape == second[name].shape, name
        assert tensor.contiguous().view(torch.uint8).equal(second[name].contiguous().view(torch.uint8)), name


def test_import_folder_layout(tmp_path):
    reference = make_hf_model("Qwen2ForCausalLM")
    reference.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer_config.json").write_text("{}")
    out = import_hf(str(tmp_path / "hf"), tmp_path / "imported")

    assert sorted(p.name for p in out.iterdir()) == ["experiment", "hf", "import.json", "model.safetensors", "model.yaml"]
    assert sorted(p.name for p in (out / "hf").iterdir()) == ["config.json", "generation_config.json", "tokenizer_config.json"]
    node, state, _ = read_model(out)
    assert node["_target_"] == "currytrain.model.gqa.GQATransformer"
    assert (node["dim"], node["n_kv_heads"], node["qkv_bias"], node["tie_embeddings"]) == (64, 2, True, True)
    assert node["rope_theta"] == 1e6
    assert "layers.1.attention.wq.bias" in state and "output.weight" not in state  # tied: stored once
    torch.testing.assert_close(state["layers.1.attention.wk.weight"], reference.model.layers[1].self_attn.k_proj.weight)
    assert json.loads((out / "import.json").read_text())["architecture"] == "Qwen2ForCausalLM"

    exported = export_hf(out, tmp_path / "exported")
    assert (exported / "tokenizer_config.json").is_file() and (exported / "generation_config.json").is_file()
    assert not list(exported.glob("*.bin"))


def test_gqa_defaults_add_no_parameters():
    """qkv_bias/qk_norm are off by default: existing checkpoints keep exactly their parameter names."""
    from currytrain.model.gqa import GQATransformer

    names = set(GQATransformer(128, 64, 2, 4, 2, 96, 32).state_dict())
    assert not [n for n in names if n.endswith(".bias") or "q_norm" in n or "k_norm" in n]
    qwen = set(GQATransformer(128, 64, 2, 4, 2, 96, 32, qkv_bias=True, qk_norm=True).state_dict())
    assert qwen - names == {f"layers.{i}.attention.{m}" for i in range(2) for m in ("wq.bias", "wk.bias", "wv.bias", "q_norm.weight", "k_norm.weight")}


def test_mixtral_expert_layout_matches_transformers(tmp_path):
    """The model=moe layout (stacked w1/w3/w2, router.gate) with softmax top-k renormalised routing
    reproduces transformers' Mixtral block, computed here by hand from the converted tensors; both
    on-disk expert layouts import the same."""
    reference = make_hf_model("MixtralForCausalLM")
    reference.save_pretrained(tmp_path / "hf")
    family = FAMILIES["MixtralForCausalLM"]
    node = {"n_layers": 2, "num_experts": 4, "expert_hidden": 96, "tie_embeddings": False, "qkv_bias": False, "qk_norm": False}

    reader = SafetensorsReader(tmp_path / "hf")
    assert any(".block_sparse_moe.experts.3.w2.weight" in n for n in reader.keys())  # the on-disk layout of transformers 5
    state, used, missing = family.to_currytrain(reader, reader.keys(), node)
    assert not missing and used == reader.keys()
    assert state["layers.0.moe.experts.w1"].shape == (4, 96, 64) and state["layers.0.moe.experts.w2"].shape == (4, 64, 96)

    x = torch.randn(10, 64, generator=torch.Generator().manual_seed(2))
    gate, w1, w2, w3 = (state[f"layers.1.moe.{k}"] for k in ("router.gate.weight", "experts.w1", "experts.w2", "experts.w3"))
    probs = torch.softmax(x @ gate.T, dim=-1)
    weights, experts = probs.topk(2, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    ours = torch.zeros_like(x)
    for token in range(x.shape[0]):
        for weight, e in zip(weights[token], experts[token]):
            hidden = torch.nn.functional.silu(w1[e] @ x[token]) * (w3[e] @ x[token])
            ours[token] += weight * (w2[e] @ hidden)
    with torch.no_grad():
        torch.testing.assert_close(ours, reference.model.layers[1].mlp(x[None])[0], atol=1e-5, rtol=1e-5)

    # transformers 5 fuses w1|w3 into gate_up_proj in memory; a file with those names imports the same.
    (tmp_path / "fused").mkdir()
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, tmp_path / "fused" / "model.safetensors")
    fused = SafetensorsReader(tmp_path / "fused")
    assert any(n.endswith("mlp.experts.gate_up_proj") for n in fused.keys())
    fused_state, _, fused_missing = family.to_currytrain(fused, fused.keys(), node)
    assert not fused_missing and fused_state.keys() == state.keys()
    assert all(torch.equal(fused_state[k], state[k]) for k in state)

    # Export writes the per-expert layout, which transformers loads back without a missing key.
    full_node = {**node, "_target_": "currytrain.model.moe.MoETransformer", "vocab_size": 128, "dim": 64, "n_heads": 4, "n_kv_heads": 2}
    full_node.update(mlp_hidden=96, max_seq_len=64, rope_theta=1e6, norm_eps=1e-5, init_std=0.02, top_k=2)
    full_node.update(gating="softmax", renormalize=True, capacity_factor=0.0)
    write_hf(full_node, state, tmp_path / "exported")
    with torch.no_grad():
        torch.testing.assert_close(load_exported(tmp_path / "exported")(TOKENS).logits, reference(TOKENS).logits, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="capacity_factor"):
        write_hf({**full_node, "capacity_factor": 1.25}, state, tmp_path / "refused")


def test_moe_exports_to_mixtral_unless_it_has_a_shared_expert(tmp_path):
    """A model=moe built by curryTrain (not imported) exports to Mixtral with equal logits. Mixtral has no
    shared expert, so model.shared_expert=true is refused instead of exported without it."""
    node, ours = make_moe_model()
    write_hf(node, ours.state_dict(), tmp_path / "exported")
    with torch.no_grad():
        torch.testing.assert_close(load_exported(tmp_path / "exported")(TOKENS).logits, ours(TOKENS), atol=1e-5, rtol=0)

    shared_node, shared = make_moe_model(shared_expert=True)
    shared_state = shared.state_dict()
    assert any(".moe.shared_expert." in name for name in shared_state)
    with pytest.raises(ConfigError, match=r"as MixtralForCausalLM: model\.shared_expert=true: Mixtral has no shared expert"):
        write_hf(shared_node, shared_state, tmp_path / "shared")
    assert not (tmp_path / "shared").exists()

    # Any other weight the Mixtral mapping does not write is refused as well, never left out silently.
    extra = {**ours.state_dict(), "layers.0.moe.extra.weight": torch.zeros(4)}
    with pytest.raises(ConfigError, match=r"1 weights have no MixtralForCausalLM counterpart .*layers\.0\.moe\.extra\.weight"):
        write_hf(node, extra, tmp_path / "extra")
    assert not (tmp_path / "extra").exists()


def test_export_family_follows_the_model_class(monkeypatch):
    """Export picks the architecture by the class the node builds (then qkv_bias/qk_norm), for every model option."""
    import currytrain.model.gqa
    from currytrain.config import SCHEMAS

    nodes = {name: dataclasses.asdict(schema()) for name, schema in SCHEMAS["model"].items()}
    assert family_for_model(nodes["gqa"]) is FAMILIES["LlamaForCausalLM"]
    assert family_for_model({**nodes["gqa"], "qkv_bias": True}) is FAMILIES["Qwen2ForCausalLM"]
    assert family_for_model({**nodes["gqa"], "qk_norm": True}) is FAMILIES["Qwen3ForCausalLM"]
    assert "no transformers counterpart" in family_for_model({**nodes["gqa"], "qkv_bias": True, "qk_norm": True})
    assert family_for_model(nodes["moe"]) is FAMILIES["MixtralForCausalLM"]
    assert family_for_model(nodes["spiking"]) == (
        "model._target_=currytrain.model.spiking.SpikingTransformer has no Hugging Face counterpart; export supports model=gqa and model=moe"
    )

    # A subclass may change forward(), so it does not inherit the export; neither do unknown or disallowed targets.
    class PatchedGQA(currytrain.model.gqa.GQATransformer):
        pass

    monkeypatch.setattr(currytrain.model.gqa, "PatchedGQA", PatchedGQA, raising=False)
    for target in ("currytrain.model.gqa.PatchedGQA", "currytrain.model.absent.Model", "currytrain.model.gqa.Absent", "os.path.join"):
        assert family_for_model({**nodes["gqa"], "_target_": target}) == (
            f"model._target_={target} has no Hugging Face counterpart; export supports model=gqa and model=moe"
        )


@pytest.mark.parametrize(
    "architecture, overrides, message",
    [
        (
            "LlamaForCausalLM",
            dict(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "original_max_position_embeddings": 32}),
            r"rope_type=longrope .*default, linear, llama3 .*yarn and dynamic",
        ),
        ("LlamaForCausalLM", dict(attention_bias=True), "attention_bias"),
        ("LlamaForCausalLM", dict(hidden_act="relu"), "hidden_act=relu"),
        ("mistral-v0.1-shaped", dict(layer_types=["sliding_attention", "full_attention"]), "layer_types mixes sliding and full layers"),
        ("mistral-v0.3-shaped", dict(attention_bias=True), "attention_bias"),
    ],
)
def test_unsupported_configs_are_refused(architecture, overrides, message, tmp_path):
    architecture, config_class, case = CASES[architecture]
    config = getattr(transformers, config_class)(**{**TINY, **case, **overrides})
    config.architectures = [architecture]
    config.save_pretrained(tmp_path / "hf")
    with pytest.raises(ConfigError, match=message):
        import_hf(str(tmp_path / "hf"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unsupported_sources_are_refused(tmp_path, monkeypatch):
    transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4, architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ConfigError, match=r"unsupported architecture \['GPT2LMHeadModel'\]"):
        import_hf(str(tmp_path / "gpt2"), tmp_path / "out")

    make_hf_model("LlamaForCausalLM").config.save_pretrained(tmp_path / "pickled")
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ConfigError, match="never unpickles"):
        import_hf(str(tmp_path / "pickled"), tmp_path / "out")

    with pytest.raises(ConfigError, match="does not exist"):
        import_hf(str(tmp_path / "missing"), tmp_path / "out")
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):  # a well-formed Hub id, but runs/ is a local folder
        import_hf("runs/missing", tmp_path / "out")

    make_hf_model("LlamaForCausalLM").save_pretrained(tmp_path / "hf")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("an earlier result")
    with pytest.raises(ConfigError, match="--overwrite"):
        import_hf(str(tmp_path / "hf"), tmp_path / "taken")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "an earlier result"

    with pytest.raises(ConfigError, match="neither a run folder"):
        export_hf(tmp_path / "hf", tmp_path / "exported")


# ---------------------------------------------------------------------------------------------- CLI, offline


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    full_env.update(PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "currytrain.cli", *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def populate_cache(hub_cache: Path, repo_id: str, files_from: Path) -> None:
    """The Hub cache layout, written by hand: refs/main names a commit whose snapshot holds the files."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for path in files_from.iterdir():
        (repo / "snapshots" / commit / path.name).write_bytes(path.read_bytes())


def test_cli_imports_from_the_cache_offline(tmp_path):
    reference = make_hf_model("LlamaForCausalLM")
    reference.save_pretrained(tmp_path / "hf")
    populate_cache(tmp_path / "home" / "hub", "tiny-org/tiny-llama", tmp_path / "hf")

    done = cli("hf", "import", "tiny-org/tiny-llama", "--out", str(tmp_path / "imported"), env={"HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        torch.testing.assert_close(load_model(tmp_path / "imported")(TOKENS), reference(TOKENS).logits, atol=1e-5, rtol=0)
    assert json.loads((tmp_path / "imported" / "import.json").read_text())["source"] == "tiny-org/tiny-llama"


def test_cli_offline_without_cache_names_the_local_path(tmp_path):
    started = time.monotonic()
    done = cli("hf", "import", "tiny-org/absent", env={"HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}, timeout=30)
    assert time.monotonic() - started < 15
    assert done.returncode == 2, done.stderr
    assert "HF_HUB_OFFLINE=1" in done.stderr and "currytrain hf import DIR" in done.stderr and "hf download tiny-org/absent" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_silent_hub_fails_within_seconds(tmp_path, monkeypatch):
    """A Hub that accepts the connection and never answers: the cache is tried, then a clear error, no hang."""
    from huggingface_hub import constants

    from currytrain.hf.hub import resolve_source

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # never accepted, never answered
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError, match=r"did not answer within .*currytrain hf import DIR"):
            resolve_source("tiny-org/absent")
    finally:
        silent.close()
    assert time.monotonic() - started < 15


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_run_folder_exports_to_transformers(tmp_path):
    run = tmp_path / "run"
    trained = launch(
        "data.max_bytes=300000",
        "trainer.max_steps=2",
        "optimizer.schedule.warmup_steps=0",
        "logger=[jsonl]",
        "model.dim=64",
        "model.n_layers=2",
        "model.n_heads=4",
        "model.n_kv_heads=2",
        "model.mlp_hidden=96",
        "model.max_seq_len=64",
        "model.tie_embeddings=true",
        f"hydra.run.dir={run}",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (run / "checkpoints" / "step_2" / "COMPLETE").is_file()

    done = cli("hf", "export", str(run), str(tmp_path / "exported"))
    assert done.returncode == 0, done.stderr
    exported = load_exported(tmp_path / "exported")
    assert type(exported).__name__ == "LlamaForCausalLM" and exported.config.tie_word_embeddings
    ours = load_model(run)
    tokens = TOKENS % 256
    with torch.no_grad():
        torch.testing.assert_close(exported(tokens).logits, ours(tokens), atol=1e-5, rtol=0)
    # The exported file holds the checkpoint's tensors, read here straight from DCP by name.
    import torch.distributed.checkpoint as dcp

    wanted = {"tok_embeddings.weight": torch.empty(256, 64), "layers.1.mlp.w2.weight": torch.empty(64, 96)}
    dcp.load({"train": {"model": wanted}}, checkpoint_id=str(run / "checkpoints" / "step_2"), no_dist=True)
    written = load_file(tmp_path / "exported" / "model.safetensors")
    assert torch.equal(written["model.embed_tokens.weight"], wanted["tok_embeddings.weight"])
    assert torch.equal(written["model.layers.1.mlp.down_proj.weight"], wanted["layers.1.mlp.w2.weight"])
    assert not list((tmp_path / "exported").glob("*.bin"))

    with pytest.raises(ConfigError, match="--overwrite"):
        export_hf(run, tmp_path / "exported")
    export_hf(run / "checkpoints" / "step_2", tmp_path / "exported", dtype="bfloat16", overwrite=True)
    halved = load_file(tmp_path / "exported" / "model.safetensors")
    assert "lm_head.weight" not in halved  # tied, as transformers itself saves it
    assert halved["model.norm.weight"].dtype == torch.bfloat16
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.slow
def test_training_starts_from_imported_weights(tmp_path):
    """trainer.init_from=<import>: a config that does not match names every override; one that does loads the weights."""
    make_hf_model("LlamaForCausalLM").save_pretrained(tmp_path / "hf")
    imported = import_hf(str(tmp_path / "hf"), tmp_path / "imported")
    common = ["data=synthetic", "trainer.max_steps=2", "optimizer.schedule.warmup_steps=1", f"trainer.init_from={imported}"]

    mismatch = launch(*common, f"hydra.run.dir={tmp_path / 'bad'}", tiny=False)
    assert mismatch.returncode == 2, mismatch.stderr
    fix = mismatch.stderr.split("pass ", 1)[1].split()
    assert {"model.dim=64", "model.n_layers=2", "model.vocab_size=128"} <= set(fix) and "Traceback" not in mismatch.stderr
    assert not (tmp_path / "bad").exists(), "caught by validation, before the run folder is made"

    run_dir = tmp_path / "run"
    result = launch(*common, *fix, "trainer.progress=false", f"hydra.run.dir={run_dir}", tiny=False)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    assert [e["path"] for e in events if e["type"] == "init_from"] == [str(imported)]

    from omegaconf import OmegaConf

    from currytrain.trainer.trainer import Trainer

    trainer = Trainer(OmegaConf.load(run_dir / "resolved.yaml"), tmp_path / "inspect")
    trainer.maybe_init_from()
    _, state, _ = read_model(imported)
    for name, tensor in state.items():
        torch.testing.assert_close(trainer.model.state_dict()[name], tensor, rtol=0, atol=0)


def renamed(pairs: dict[str, str]):
    """A state edit that renames the weights whose name holds a key of `pairs` (e.g. post norms placed before)."""

    def edit(state: dict, node: dict) -> dict:
        out = {}
        for name, tensor in state.items():
            for old, new in pairs.items():
                name = name.replace(old, new)
            out[name] = tensor
        return out

    return edit


def dropped(*parts: str):
    """A state edit that leaves out the weights whose name holds one of `parts`."""
    return lambda state, node: {name: t for name, t in state.items() if not any(part in name for part in parts)}


def unbiased(state: dict, node: dict) -> dict:
    return {name: torch.zeros_like(t) if name.endswith("router.expert_bias") else t for name, t in state.items()}


def interleaved(state: dict, node: dict) -> dict:
    """DeepSeek's RoPE rows as the checkpoint lays them out (interleaved pairs), not reordered for rotate-half."""
    state = dict(state)
    FAMILIES["DeepseekV3ForCausalLM"].reorder_rope_rows(state, node, to_hf=True)
    return state


# case -> (what is left out, the model fields that leave it out, how the weights are edited to fit)
CONTROLS = [
    ("llama-3.2-shaped", "llama3 RoPE scaling", {"rope_scaling": "none"}, None),
    ("qwen3-yarn", "YaRN", {"rope_scaling": "none"}, None),
    # Past an original context shorter than the input (dynamic), the unscaled model needs the longer table.
    ("llama-dynamic-rope", "dynamic NTK scaling", {"rope_scaling": "none", "max_seq_len": 64}, None),
    ("mistral-v0.1-shaped", "the sliding window", {"sliding_window": 0}, None),
    ("Gemma2ForCausalLM", "attention soft-capping", {"attn_softcap": 0.0}, None),
    ("Gemma2ForCausalLM", "final-logit soft-capping", {"logit_softcap": 0.0}, None),
    ("Gemma2ForCausalLM", "the post-norms (sandwich -> pre)", {"norm_position": "pre"}, dropped(".post_attention_norm.", ".post_mlp_norm.")),
    ("Gemma2ForCausalLM", "the window pattern (every layer full)", {"sliding_window": 0, "layer_types": []}, None),
    ("Gemma2ForCausalLM", "the window pattern (every layer sliding)", {"layer_types": []}, None),
    ("Gemma2ForCausalLM", "query_pre_attn_scalar", {"attn_scale": 0.0}, None),
    ("Gemma2ForCausalLM", "GeGLU (silu instead)", {"mlp_activation": "silu"}, None),
    ("GemmaForCausalLM", "the 1 + weight norms", {"norm_unit_offset": False}, None),
    ("GemmaForCausalLM", "the sqrt(dim) embedding scale", {"scale_embeddings": False}, None),
    ("Gemma3ForCausalLM", "the local RoPE of sliding layers", {"rope_local_theta": 0.0}, None),
    ("Gemma3ForCausalLM", "qk-norm", {"qk_norm": False}, dropped(".q_norm.", ".k_norm.")),
    (
        "Olmo2ForCausalLM",
        "the post-norms (placed before instead)",
        {"norm_position": "pre"},
        renamed({"post_attention_norm": "attention_norm", "post_mlp_norm": "mlp_norm"}),
    ),
    ("qwen2-windowed", "the window pattern (every layer sliding)", {"layer_types": []}, None),
    ("phi3-128k-shaped", "LongRoPE", {"rope_scaling": "none"}, None),
    ("phi3-128k-shaped", "LongRoPE's long factors", {"rope_long_factor": "rope_short_factor"}, None),
    ("Phi3ForCausalLM", "partial rotary (all channels rotated)", {"rope_dim": 0}, None),
    ("Qwen3MoeForCausalLM", "norm_topk_prob", {"renormalize": False}, None),
    ("DeepseekV3ForCausalLM", "MLA's RoPE layout (interleaved rows kept)", {}, interleaved),
    ("DeepseekV3ForCausalLM", "YaRN's mscale in the softmax scale", {"attn_scale": 0.0}, None),
    ("DeepseekV3ForCausalLM", "the routing correction bias", {}, unbiased),
    ("DeepseekV3ForCausalLM", "group-limited routing", {"router_groups": 1}, None),
    ("DeepseekV3ForCausalLM", "routed_scaling_factor", {"routed_scale": 1.0}, None),
]


@pytest.mark.parametrize("case, left_out, changes, edit", CONTROLS, ids=[f"{c[0]}: {c[1]}" for c in CONTROLS])
def test_leaving_a_mechanism_out_changes_the_logits(case, left_out, changes, edit, checkpoints):
    """Negative controls for the parity cases: the same weights in a model without the mechanism (its fields at
    their defaults) compute other logits than transformers', so it is the mechanism that makes them match."""
    from omegaconf import OmegaConf

    from currytrain.model import build_model

    checkpoint = checkpoints(case)
    node, state, _ = read_model(checkpoint.imported)
    changes = {key: node[value] if isinstance(value, str) and value in node else value for key, value in changes.items()}
    assert all(node.get(key) != value for key, value in changes.items() if key != "max_seq_len"), "the import sets what the control leaves out"
    if node["tie_embeddings"]:
        state = {**state, "output.weight": state["tok_embeddings.weight"]}
    state = edit(state, node) if edit else state
    control = build_model(OmegaConf.create({**node, **changes})).eval()
    control.load_state_dict(state)
    with torch.no_grad():
        assert (control(TOKENS) - checkpoint.logits).abs().max() > 1e-3, left_out
    if case == "mistral-v0.1-shaped":
        assert "head_dim" not in node and node["sliding_window"] == 6  # head_dim 16 == 64 / 4: derived, not stored


def test_import_writes_a_finetune_experiment_naming_the_model_option(tmp_path):
    """MoE imports name model=moe (not a class); max_seq_len is shortened; the CLI prints the command."""
    make_hf_model("MixtralForCausalLM", max_position_embeddings=4096).save_pretrained(tmp_path / "hf")
    done = cli("hf", "import", str(tmp_path / "hf"), "--out", str(tmp_path / "imported"))
    assert done.returncode == 0, done.stderr
    folder = (tmp_path / "imported").resolve()
    assert f"python launch.py hydra.searchpath=[file://{folder}] experiment=finetune data.paths=[YOUR_TEXT]" in done.stdout
    text = (folder / "experiment" / "finetune.yaml").read_text()
    assert text.startswith("# @package _global_\n") and "override /model: moe" in text and "override /data: tokens" in text
    assert "max_seq_len: 512" in text and "_target_" not in text
    assert "data.tokenizer=" in text  # this import has no tokenizer.json: the file says what to pass


@pytest.mark.slow
def test_init_from_accepts_a_shorter_context(tmp_path, compose_cfg):
    """max_seq_len only sizes the RoPE tables: a config may train an import at a shorter context."""
    from currytrain.validate import validate

    make_hf_model("llama-3.2-shaped").save_pretrained(tmp_path / "hf")
    imported = import_hf(str(tmp_path / "hf"), tmp_path / "imported")
    node, _, _ = read_model(imported)
    fields = [f"model.{k}={v}" for k, v in node.items() if k not in ("_target_", "max_seq_len")]
    fields.append("data=synthetic")  # token ids below the import's vocab_size=128
    cfg = compose_cfg(*fields, "model.max_seq_len=16", f"trainer.init_from={imported}", tiny=False)
    assert validate(cfg) == []
    problems = validate(compose_cfg(*fields, "model.rope_scaling=none", f"trainer.init_from={imported}", tiny=False))
    assert len(problems) == 1 and "pass model.rope_scaling=llama3" in problems[0]


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.rope_scaling=ntk", r"model.rope_scaling=ntk is not one of \['none', 'linear', 'llama3', 'yarn', 'dynamic', 'longrope'\]"),
        ("model.rope_scaling=longrope", "model.rope_short_factor has 0 entries, rope_scaling=longrope needs one per rotated channel pair"),
        ("model.rope_beta_slow=40", "model.rope_beta_fast=32.0 must exceed model.rope_beta_slow=40.0 > 0"),
        ("model.head_dim=15", "model.head_dim=15 is odd, RoPE needs an even head size: pass model.head_dim=16"),
        ("model.sliding_window=-1", "model.sliding_window=-1 must be >= 0"),
        ("model.rope_high_freq_factor=0.5", "must exceed model.rope_low_freq_factor"),
    ],
)
def test_bad_rope_fields_are_config_errors(override, message, compose_cfg):
    from currytrain.validate import validate

    extra = ["model.rope_scaling=llama3"] if "freq" in override else ["model.rope_scaling=yarn"] if "beta" in override else []
    problems = validate(compose_cfg(*extra, override))
    assert any(__import__("re").search(message, p) for p in problems), problems


def corrupt(path: Path, kind: str) -> None:
    """Damage a safetensors file the ways downloads and disks do."""
    blob = path.read_bytes()
    damaged = {
        "empty": b"",
        "random": bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(3), dtype=torch.uint8).tolist()),
        "truncated": blob[: len(blob) - 100],
        "header": blob[:8] + b"{not json" + blob[17:],
    }[kind]
    path.write_bytes(damaged)


@pytest.mark.parametrize("kind", ["empty", "random", "truncated", "header"])
def test_corrupted_safetensors_are_refused_naming_the_file(kind, tmp_path):
    """import, export and init_from: one ConfigError naming the file, nothing written."""
    from currytrain.weights import safetensors_problem

    make_hf_model("LlamaForCausalLM").save_pretrained(tmp_path / "hf")
    imported = import_hf(str(tmp_path / "hf"), tmp_path / "imported")
    assert safetensors_problem(tmp_path / "hf" / "model.safetensors") is None
    for weights, action, out in (
        (tmp_path / "hf" / "model.safetensors", lambda: import_hf(str(tmp_path / "hf"), tmp_path / "again"), tmp_path / "again"),
        (imported / "model.safetensors", lambda: export_hf(imported, tmp_path / "exported"), tmp_path / "exported"),
    ):
        corrupt(weights, kind)
        with pytest.raises(ConfigError) as error:
            action()
        assert str(weights) in str(error.value) and "\n" not in str(error.value)
        assert not out.exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_corrupted_weights_exit_2_from_the_commands(tmp_path):
    make_hf_model("LlamaForCausalLM").save_pretrained(tmp_path / "hf")
    imported = import_hf(str(tmp_path / "hf"), tmp_path / "imported")
    corrupt(imported / "model.safetensors", "truncated")
    run = launch("data=synthetic", f"trainer.init_from={imported}", f"hydra.run.dir={tmp_path / 'run'}")
    assert run.returncode == 2 and f"{imported}/model.safetensors is truncated or corrupted" in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and not (tmp_path / "run").exists()
    corrupt(tmp_path / "hf" / "model.safetensors", "random")
    done = cli("hf", "import", str(tmp_path / "hf"), "--out", str(tmp_path / "again"))
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and f"{tmp_path}/hf/model.safetensors" in done.stderr, done.stderr
    assert not (tmp_path / "again").exists()


def test_export_shards_large_weights_and_keeps_the_router_coefficient(tmp_path):
    """Weights above --max-shard-size go to shards with an index transformers loads; the MoE load-balancing
    coefficient travels to router_aux_loss_coef and back on import; a bad size is a ConfigError, nothing written."""
    node, ours = make_moe_model(aux_loss_coef=0.02)
    write_hf(node, ours.state_dict(), tmp_path / "sharded", max_shard_size=100_000)
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1 and not (tmp_path / "sharded" / "model.safetensors").exists()
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    exported = load_exported(tmp_path / "sharded")
    assert exported.config.router_aux_loss_coef == 0.02
    with torch.no_grad():
        torch.testing.assert_close(exported(TOKENS).logits, ours(TOKENS), atol=1e-5, rtol=0)
    import_hf(str(tmp_path / "sharded"), tmp_path / "reimported")
    node_back, _, _ = read_model(tmp_path / "reimported")
    assert node_back["aux_loss_coef"] == 0.02
    with pytest.raises(ConfigError, match="--max-shard-size 5 gigs"):
        write_hf(node, ours.state_dict(), tmp_path / "bad", max_shard_size="5 gigs")
    assert not (tmp_path / "bad").exists()


# ---------------------------------------------------------------------------------------------- new families, end to end


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    """A tiny BPE tokenizer (320 ids) trained here and a repetitive English corpus: what a fine-tune reads."""
    from tiny_tokenizer import train_tokenizer, write_corpus

    root = tmp_path_factory.mktemp("text")
    return train_tokenizer(root / "tokenizer").parent, write_corpus(root / "corpus")


# One family per new mechanism: soft-caps, sandwich norms and the window pattern (Gemma 2), post-norms (OLMo 2),
# LongRoPE with partial rotary and fused projections (Phi-3 128k), latent attention and corrected routing (DeepSeek-V3).
FINETUNED = ["Gemma2ForCausalLM", "Olmo2ForCausalLM", "phi3-128k-shaped", "DeepseekV3ForCausalLM"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("case", FINETUNED)
def test_a_finetuned_import_exports_to_transformers_which_generates_from_it(case, text_data, tmp_path):
    """The user's path: import (with a tokenizer), run the import's own experiment=finetune for 20 steps on text
    (the loss falls), export the run, and transformers loads it, computes our logits and generates our tokens."""
    tokenizer, corpus = text_data
    make_hf_model(case, vocab_size=320).save_pretrained(tmp_path / "hf")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "hf" / name).write_bytes((tokenizer / name).read_bytes())
    imported = import_hf(str(tmp_path / "hf"), tmp_path / "imported")

    run = tmp_path / "run"
    result = launch(
        f"hydra.searchpath=[file://{imported.resolve()}]",
        "experiment=finetune",
        f"data.paths=[{corpus}]",
        f"data.cache_dir={tmp_path / 'token_cache'}",
        "trainer.max_steps=20",
        "trainer.batch_size=4",
        "trainer.eval_batches=1",
        "trainer.log_every=1",
        "trainer.progress=false",
        "optimizer.lr=3e-3",
        "optimizer.schedule.warmup_steps=2",
        "logger=[jsonl]",
        f"hydra.run.dir={run}",
        tiny=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [row["train/loss"] for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "train/loss" in row]
    print(f"{case}: mean train loss of steps 1-5 {sum(losses[:5]) / 5:.3f}, of steps 16-20 {sum(losses[-5:]) / 5:.3f}")
    assert len(losses) == 20 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses

    export_hf(run, tmp_path / "exported")
    exported = load_exported(tmp_path / "exported")
    assert type(exported).__name__ == CASES[case][0] and (tmp_path / "exported" / "tokenizer.json").is_file()
    ours = load_model(run)
    prompt = torch.tensor([transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer / "tokenizer.json")).encode("the quick brown")])
    with torch.no_grad():
        torch.testing.assert_close(exported(TOKENS % 320).logits, ours(TOKENS % 320), atol=1e-5, rtol=0)
    uncached = CASES[case][2].get("rope_scaling", {}).get("rope_type") in UNCACHED
    generated = hf_greedy(exported, prompt, use_cache=not uncached)
    assert generated.shape[1] == prompt.shape[1] + NUM_NEW_TOKENS
    assert torch.equal(generated, greedy(ours, prompt, NUM_NEW_TOKENS))


def cli_in_process(capsys, *args: str) -> tuple[int, str]:
    """`currytrain ...` run by its main() here (exit code, stderr): the commands' error handling without a process."""
    from currytrain.cli import main

    capsys.readouterr()  # what came before (progress bars of saving the checkpoints)
    code = main(list(args))
    return code, capsys.readouterr().err


def edited_config(source: Path, folder: Path, **changes) -> Path:
    """A copy of a checkpoint folder whose config.json has `changes` applied (None removes a key)."""
    folder.mkdir(parents=True)
    for path in source.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return folder


def test_bad_checkpoints_exit_2_naming_the_field_and_write_nothing(checkpoints, capsys, tmp_path):
    """An unmapped architecture, a RoPE type or a quantization config a family does not support, a *.bin-only
    checkpoint: `currytrain hf import` prints one line naming what is wrong, exits 2 and leaves no output."""
    llama = checkpoints("LlamaForCausalLM").folder / "hf"
    longrope = dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0] * 8, long_factor=[2.0] * 8, original_max_position_embeddings=16)
    cases = {
        "architecture": (
            edited_config(llama, tmp_path / "gpt2", architectures=["GPT2LMHeadModel"], model_type="gpt2"),
            "unsupported architecture ['GPT2LMHeadModel']",
        ),
        "rope type": (edited_config(llama, tmp_path / "longrope", rope_parameters=longrope, rope_scaling=None), "rope_type=longrope"),
        "quantization": (
            edited_config(
                llama, tmp_path / "quantized", quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
            ),
            "quantization_config is set",
        ),
        "bin only": (edited_config(llama, tmp_path / "pickled"), "found only ['pytorch_model.bin']"),
    }
    (tmp_path / "pickled" / "model.safetensors").rename(tmp_path / "pickled" / "pytorch_model.bin")
    for what, (folder, message) in cases.items():
        out = tmp_path / f"out-{folder.name}"
        code, err = cli_in_process(capsys, "hf", "import", str(folder), "--out", str(out))
        assert code == 2 and message in err and err.startswith("curryTrain: ") and err.count("\n") == 1, (what, err)
        assert not out.exists() and not list(tmp_path.glob(f".{out.name}*")), what  # nor its staging folder


def cpu_allocation_peak(action) -> tuple[int, int]:
    """(peak, net) bytes of torch's CPU allocations while `action()` runs, from the profiler's allocation events
    (every tensor a safetensors read, a split or a stack makes is one), in time order."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        action()
    found, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            found.append((event.start_time_ns, event.extra_fields.alloc_size))
    live = peak = 0
    for _, size in sorted(found):
        live += size
        peak = max(peak, live)
    return peak, live


def test_import_of_a_sharded_checkpoint_holds_one_shard_beyond_the_model(tmp_path):
    """A Mixtral of 4 shards: import reads shard by shard, tensor by tensor (per-expert matrices stacked layer by
    layer), so the live tensor memory it peaks at stays within the model's size plus its largest shard."""
    config = transformers.MixtralConfig(
        **{**TINY, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "vocab_size": 1024}, num_local_experts=8
    )
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config)
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    model.save_pretrained(tmp_path / "hf", max_shard_size=model_bytes // 3)
    del model
    shards = sorted((tmp_path / "hf").glob("model-*.safetensors"))
    assert len(shards) == 4
    largest = max(path.stat().st_size for path in shards)

    peak, _ = cpu_allocation_peak(lambda: import_hf(str(tmp_path / "hf"), tmp_path / "imported"))
    state = tensors_of(tmp_path / "imported")
    assert sum(t.numel() * t.element_size() for t in state.values()) == model_bytes
    print(f"import peak {peak / 2**20:.1f} MiB: model {model_bytes / 2**20:.1f} MiB + largest shard {largest / 2**20:.1f} MiB")
    assert model_bytes <= peak <= model_bytes + largest, (peak, model_bytes, largest)


def model_overrides(node: dict) -> list[str]:
    """The launch.py overrides that describe an imported model node (model=gqa|moe and each field)."""

    def value(v):
        return "[" + ",".join(map(str, v)) + "]" if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else str(v)

    option = {"currytrain.model.gqa.GQATransformer": "gqa", "currytrain.model.moe.MoETransformer": "moe"}[node["_target_"]]
    return [f"model={option}", *(f"model.{key}={value(v)}" for key, v in node.items() if key not in ("_target_", "max_seq_len"))]


@pytest.mark.slow  # ~8 s; every family's tiny import climbs it (docs/hf.md), this test keeps the most unusual one
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_deepseek_v3_import_climbs_check_sanity(checkpoints, tmp_path):
    """Latent attention, group-limited corrected routing, shared experts and a dense layer, freshly initialised from
    the import's config: init loss near ln(vocab), one batch memorised, healthy layer statistics."""
    node, _, _ = read_model(checkpoints("DeepseekV3ForCausalLM").imported)
    result = launch(
        *model_overrides(node),
        "model.max_seq_len=32",
        "data=synthetic",
        "check=sanity",
        "trainer.batch_size=4",
        f"hydra.run.dir={tmp_path / 'run'}",
        tiny=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "sanity" in (tmp_path / "run" / "report.md").read_text()
