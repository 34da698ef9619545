"""GQA decoder: attention equals plain multi-head attention, RoPE is relative, RMSNorm, causality."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from currytrain.model.gqa import GQATransformer
from currytrain.model.layers import Attention, RMSNorm, apply_rope, build_rope_cache


def _identity_rope(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(seq_len, head_dim // 2), torch.zeros(seq_len, head_dim // 2)


def test_gqa_with_kv_heads_equal_to_heads_is_plain_multi_head_attention():
    torch.manual_seed(0)
    dim, heads, seq_len = 32, 4, 10
    attention = Attention(dim, heads, heads)
    reference = nn.MultiheadAttention(dim, heads, bias=False, batch_first=True)
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([attention.wq.weight, attention.wk.weight, attention.wv.weight]))
        reference.out_proj.weight.copy_(attention.wo.weight)
    x = torch.randn(3, seq_len, dim)
    causal = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)
    expected, _ = reference(x, x, x, attn_mask=causal, need_weights=False)
    got = attention(x, *_identity_rope(seq_len, dim // heads))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_gqa_equals_multi_head_attention_with_repeated_kv_heads():
    torch.manual_seed(0)
    dim, heads, kv_heads, seq_len = 48, 6, 2, 12
    head_dim = dim // heads
    grouped = Attention(dim, heads, kv_heads)
    full = Attention(dim, heads, heads)
    with torch.no_grad():
        full.wq.weight.copy_(grouped.wq.weight)
        full.wo.weight.copy_(grouped.wo.weight)
        # Query head h reads kv head h // (heads // kv_heads): repeat each kv head's rows accordingly.
        for name in ("wk", "wv"):
            rows = getattr(grouped, name).weight.view(kv_heads, head_dim, dim)
            getattr(full, name).weight.copy_(rows.repeat_interleave(heads // kv_heads, dim=0).reshape(dim, dim))
    cos, sin = build_rope_cache(seq_len, head_dim, 10000.0)
    x = torch.randn(2, seq_len, dim)
    torch.testing.assert_close(grouped(x, cos, sin), full(x, cos, sin), atol=1e-6, rtol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    head_dim, seq_len = 16, 64
    cos, sin = build_rope_cache(seq_len, head_dim, 10000.0)
    q, k = torch.randn(head_dim), torch.randn(head_dim)

    def score(pos_q: int, pos_k: int) -> torch.Tensor:
        qs = torch.zeros(1, 1, seq_len, head_dim)
        ks = torch.zeros(1, 1, seq_len, head_dim)
        qs[0, 0, pos_q], ks[0, 0, pos_k] = q, k
        return apply_rope(qs, cos, sin)[0, 0, pos_q] @ apply_rope(ks, cos, sin)[0, 0, pos_k]

    torch.testing.assert_close(score(5, 2), score(40, 37), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(score(3, 3), score(50, 50), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(score(5, 2), score(5, 4))


def test_rmsnorm_equals_functional_rms_norm():
    torch.manual_seed(0)
    norm = RMSNorm(24, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 7, 24) * 3
    torch.testing.assert_close(norm(x), F.rms_norm(x, (24,), norm.weight, eps=1e-5), atol=1e-6, rtol=1e-5)


def _tiny_model(**overrides) -> GQATransformer:
    args = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=64, max_seq_len=16)
    return GQATransformer(**{**args, **overrides})


def test_logits_are_causal():
    torch.manual_seed(0)
    model = _tiny_model()
    tokens = torch.randint(64, (2, 16))
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 64
    torch.testing.assert_close(model(tokens)[:, :10], model(changed)[:, :10])
    assert not torch.allclose(model(tokens)[:, 10:], model(changed)[:, 10:])


def test_initial_loss_is_near_uniform_and_seed_fixes_init():
    torch.manual_seed(0)
    model = _tiny_model()
    tokens = torch.randint(64, (8, 16))
    loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    assert abs(loss.item() - torch.log(torch.tensor(64.0)).item()) < 0.1
    torch.manual_seed(0)
    again = _tiny_model()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_tied_embeddings_share_one_tensor():
    model = _tiny_model(tie_embeddings=True)
    assert model.output.weight is model.tok_embeddings.weight
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in _tiny_model().parameters())
