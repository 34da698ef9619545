"""model=moe: routing, dropping, balance loss, grouped experts against a per-token loop, gradients, a real run."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from currytrain.model import build_model
from currytrain.model.grouped import grouped_linear
from currytrain.model.moe import MoE, MoETransformer, TopKRouter, build_dispatch, load_balancing_loss
from currytrain.model.protocol import model_loss


def tiny_model(**overrides) -> MoETransformer:
    sizes = dict(vocab_size=32, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, mlp_hidden=24, max_seq_len=16)
    sizes.update(dict(num_experts=4, top_k=2, expert_hidden=8))
    sizes.update(overrides)
    return MoETransformer(**sizes)


def forced_moe(first: list[int], second: list[int], capacity_factor: float) -> tuple[MoE, torch.Tensor]:
    """An MoE over 4 experts (dim 4) whose router sends token t to experts (first[t], second[t]), in that order."""
    torch.manual_seed(0)
    moe = MoE(dim=4, num_experts=4, top_k=2, expert_hidden=8, capacity_factor=capacity_factor).double()
    with torch.no_grad():
        moe.router.gate.weight.copy_(torch.eye(4))
    x = torch.zeros(len(first), 4, dtype=torch.float64)
    x[torch.arange(len(first)), first] = 2.0
    x[torch.arange(len(first)), second] = 1.0
    return moe, x


def per_token_reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """The MoE layer written the slow, obvious way: one token and one choice at a time."""
    router, experts = moe.router, moe.experts
    num_tokens, top_k, num_experts = x.shape[0], router.top_k, router.num_experts
    choices = []
    for t in range(num_tokens):
        logits = router.gate.weight @ x[t]
        scores = logits.softmax(-1) if router.gating == "softmax" else logits.sigmoid()
        weights, indices = scores.topk(top_k)
        if router.renormalize:
            weights = weights / weights.sum()
        choices.append(list(zip(indices.tolist(), weights)))
    capacity = moe.capacity(num_tokens)
    kept = {}
    used = [0] * num_experts
    for k in range(top_k):  # every first choice queues before any second choice
        for t in range(num_tokens):
            expert, _ = choices[t][k]
            kept[t, k] = capacity is None or used[expert] < capacity
            used[expert] += 1
    out = torch.zeros_like(x)
    for t in range(num_tokens):
        for k, (e, weight) in enumerate(choices[t]):
            if kept[t, k]:
                hidden = F.silu(experts.w1[e] @ x[t]) * (experts.w3[e] @ x[t])
                out[t] += weight * (experts.w2[e] @ hidden)
        if moe.shared_expert is not None:
            out[t] += moe.shared_expert(x[t])
    return out


@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
def test_router_weights_sum_to_one_only_when_renormalised(gating):
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    router = TopKRouter(16, num_experts=8, top_k=3, gating=gating, renormalize=True)
    torch.testing.assert_close(router(x).weights.sum(-1), torch.ones(64))
    router.renormalize = False
    # Raw top-k scores: a softmax's share of the mass (< 1), or independent sigmoids (anything in (0, k)).
    assert ((router(x).weights.sum(-1) - 1).abs() > 1e-3).float().mean() > 0.9


def test_combine_weights_sum_to_one_for_every_kept_token():
    torch.manual_seed(0)
    num_tokens = 50
    router = TopKRouter(16, num_experts=4, top_k=2, renormalize=True)
    routing = router(torch.randn(num_tokens, 16) * 5)
    dispatch = build_dispatch(routing.indices, routing.weights, num_experts=4, capacity=20)
    assert dispatch.num_dropped > 0, "the test needs some drops"
    per_token = torch.zeros(num_tokens).index_add(0, dispatch.token, dispatch.weight)
    kept_per_token = torch.zeros(num_tokens).index_add(0, dispatch.token, dispatch.kept.float())
    fully_kept = kept_per_token == 2
    assert fully_kept.any() and not fully_kept.all()
    torch.testing.assert_close(per_token[fully_kept], torch.ones(int(fully_kept.sum())))
    assert (per_token[~fully_kept] < 1 - 1e-6).all()


# Tokens 0-3 choose experts (0, 1), tokens 4-7 choose (1, 0): 8 assignments on each of experts 0 and 1,
# and the balanced load is 8 * 2 / 4 = 4 per expert, so capacity = ceil(4 * factor).
@pytest.mark.parametrize(
    "capacity_factor, drop_rate",
    [(0.25, 14 / 16), (1.0, 8 / 16), (1.5, 4 / 16), (2.0, 0.0), (0.0, 0.0)],
)
def test_drop_rate_is_exact(capacity_factor, drop_rate):
    moe, x = forced_moe(first=[0] * 4 + [1] * 4, second=[1] * 4 + [0] * 4, capacity_factor=capacity_factor)
    out = moe(x.unsqueeze(0)).squeeze(0)
    assert moe.stats.drop_rate.item() == drop_rate
    torch.testing.assert_close(out, per_token_reference(moe, x), rtol=0, atol=1e-12)


def test_capacity_is_the_ceiling_of_the_exact_product():
    moe = MoE(dim=4, num_experts=4, top_k=2, expert_hidden=8, capacity_factor=1.1)
    assert moe.capacity(200) == 110  # 1.1 * 100 is 110.00000000000001 in floating point
    assert moe.capacity(202) == 112  # 1.1 * 101 = 111.1


def test_full_expert_drops_second_choices_before_first_choices():
    # Capacity 4: experts 0 and 1 each keep the four tokens that chose them first, so every token
    # keeps exactly its first choice. Dropping by token order alone would drop tokens 4-7 entirely.
    moe, x = forced_moe(first=[0] * 4 + [1] * 4, second=[1] * 4 + [0] * 4, capacity_factor=1.0)
    routing = moe.router(x)
    dispatch = build_dispatch(routing.indices, routing.weights, 4, moe.capacity(8))
    kept_experts = {(t, e) for t, e, k in zip(dispatch.token.tolist(), dispatch.expert.tolist(), dispatch.kept.tolist()) if k}
    assert kept_experts == {(t, 0) for t in range(4)} | {(t, 1) for t in range(4, 8)}
    assert (moe(x).abs().sum(-1) > 0).all()


def test_reported_drop_rate_matches_overflow_of_random_routing():
    torch.manual_seed(1)
    model = tiny_model(n_layers=1, capacity_factor=1.0)
    routings = []
    model.layers[0].moe.router.register_forward_hook(lambda module, args, out: routings.append(out))
    model(torch.randint(0, 32, (4, 16)))
    counts = torch.bincount(routings[0].indices.flatten(), minlength=4)
    capacity = math.ceil(1.0 * 64 * 2 / 4)
    overflow = (counts - capacity).clamp(min=0).sum().item()
    assert overflow > 0, "the test needs an unbalanced routing"
    assert model.training_metrics()["moe/layer0/drop_rate"] == pytest.approx(overflow / 128, abs=1e-7)


def test_balance_loss_is_minimal_when_balanced():
    torch.manual_seed(0)
    probs = torch.randn(8, 4).softmax(-1)
    balanced_top1 = torch.tensor([[0], [1], [2], [3], [0], [1], [2], [3]])
    balanced_top2 = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0], [0, 2], [1, 3], [2, 1], [3, 0]])
    assert load_balancing_loss(probs, balanced_top1, 4).item() == pytest.approx(1.0)
    assert load_balancing_loss(probs, balanced_top2, 4).item() == pytest.approx(1.0)
    # A router that sends more and more tokens to the expert it already rates highest pays more and more.
    losses = []
    for bias in (0.5, 1.0, 2.0, 4.0):
        logits = torch.randn(256, 4)
        logits[:, 0] += bias
        skewed = logits.softmax(-1)
        losses.append(load_balancing_loss(skewed, skewed.topk(2).indices, 4).item())
    assert 1.0 < losses[0] < losses[1] < losses[2] < losses[3] <= 4.0


@pytest.mark.parametrize(
    "options",
    [
        dict(),  # Mixtral: softmax, renormalised, dropless
        dict(gating="sigmoid", renormalize=False),
        dict(capacity_factor=0.75),  # padded batched path, with drops
        dict(capacity_factor=4.0, shared_hidden=12),  # padded path, nothing dropped, shared expert
    ],
)
def test_batched_experts_equal_per_token_loop(options):
    torch.manual_seed(0)
    moe = MoE(dim=16, num_experts=4, top_k=2, expert_hidden=8, **options).double()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(std=0.5)  # large enough that outputs and routing are far from trivial
    x = torch.randn(3, 10, 16, dtype=torch.float64)
    out = moe(x)
    if options.get("capacity_factor") == 0.75:
        assert moe.stats.drop_rate > 0
    torch.testing.assert_close(out.view(30, 16), per_token_reference(moe, x.view(30, 16)), rtol=0, atol=1e-6)


def test_routing_and_output_equal_hf_mixtral():
    pytest.importorskip("transformers")
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(0)
    moe = MoE(dim=16, num_experts=4, top_k=2, expert_hidden=8).double()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(std=0.5)
    hf_config = MixtralConfig(hidden_size=16, intermediate_size=8, num_local_experts=4, num_experts_per_tok=2)
    hf = MixtralSparseMoeBlock(hf_config).double().eval()
    with torch.no_grad():
        hf.gate.weight.copy_(moe.router.gate.weight)
        hf.experts.gate_up_proj.copy_(torch.cat([moe.experts.w1, moe.experts.w3], dim=1))
        hf.experts.down_proj.copy_(moe.experts.w2)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    _, hf_weights, hf_indices = hf.gate(x.view(-1, 16))
    routing = moe.router(x.view(-1, 16))
    assert torch.equal(routing.indices, hf_indices)
    torch.testing.assert_close(routing.weights, hf_weights.to(routing.weights.dtype))
    # HF routes in fp32 even for fp64 inputs, hence 1e-6 rather than fp64 round-off.
    torch.testing.assert_close(moe(x), hf(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("capacity_factor", [0.0, 1.0])
def test_gradients_reach_router_and_every_expert(capacity_factor):
    torch.manual_seed(0)
    model = tiny_model(capacity_factor=capacity_factor, shared_expert=True)
    tokens = torch.randint(0, 32, (4, 16))
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten()) + model.auxiliary_loss()
    loss.backward()
    for layer in model.layers:
        moe = layer.moe
        assert (moe.stats.load > 0).all(), "every expert needs tokens for this test"
        assert moe.router.gate.weight.grad.abs().sum() > 0
        for w in (moe.experts.w1, moe.experts.w2, moe.experts.w3):
            assert w.grad.flatten(1).abs().sum(-1).gt(0).all(), "an expert got no gradient"
        assert moe.shared_expert.w1.weight.grad.abs().sum() > 0


def test_auxiliary_losses_alone_train_the_router():
    torch.manual_seed(0)
    model = tiny_model(n_layers=1, aux_loss_coef=1.0, z_loss_coef=0.0)
    model(torch.randint(0, 32, (4, 16)))
    model.auxiliary_loss().backward()
    moe = model.layers[0].moe
    assert moe.router.gate.weight.grad.abs().sum() > 0
    assert moe.experts.w1.grad is None  # the balance loss depends on the router alone
    model.zero_grad(set_to_none=True)
    model.aux_loss_coef, model.z_loss_coef = 0.0, 1.0
    model(torch.randint(0, 32, (4, 16)))
    model.auxiliary_loss().backward()
    assert moe.router.gate.weight.grad.abs().sum() > 0


def test_training_metrics_and_auxiliary_loss_agree():
    torch.manual_seed(0)
    model = tiny_model(n_layers=2, aux_loss_coef=0.1, z_loss_coef=0.01)
    assert model.training_metrics() == {}
    assert model.auxiliary_loss().item() == 0.0
    model(torch.randint(0, 32, (2, 16)))
    metrics = model.training_metrics()
    expected = set()
    for i in range(2):
        expected |= {f"moe/layer{i}/load/e{j}" for j in range(4)}
        expected |= {f"moe/layer{i}/{name}" for name in ("drop_rate", "aux_loss", "z_loss")}
        assert sum(metrics[f"moe/layer{i}/load/e{j}"] for j in range(4)) == pytest.approx(1.0)
    assert set(metrics) == expected
    assert all(isinstance(v, float) for v in metrics.values())
    weighted = sum(0.1 * metrics[f"moe/layer{i}/aux_loss"] + 0.01 * metrics[f"moe/layer{i}/z_loss"] for i in range(2))
    assert model.auxiliary_loss().item() == pytest.approx(weighted, rel=1e-6)


def test_parameter_layout_is_the_one_the_hf_bridge_maps(compose_cfg):
    cfg = compose_cfg("model=moe", "model.n_layers=2", "model.shared_expert=true", tiny=False)
    model = build_model(cfg.model)
    m = cfg.model
    dim, hidden, experts = m.dim, m.expert_hidden, m.num_experts
    head_dim = dim // m.n_heads
    expected = {"tok_embeddings.weight": (m.vocab_size, dim), "norm.weight": (dim,), "output.weight": (m.vocab_size, dim)}
    for i in range(2):
        expected.update(
            {
                f"layers.{i}.attention.wq.weight": (m.n_heads * head_dim, dim),
                f"layers.{i}.attention.wk.weight": (m.n_kv_heads * head_dim, dim),
                f"layers.{i}.attention.wv.weight": (m.n_kv_heads * head_dim, dim),
                f"layers.{i}.attention.wo.weight": (dim, m.n_heads * head_dim),
                f"layers.{i}.attention_norm.weight": (dim,),
                f"layers.{i}.mlp_norm.weight": (dim,),
                f"layers.{i}.moe.router.gate.weight": (experts, dim),
                f"layers.{i}.moe.experts.w1": (experts, hidden, dim),
                f"layers.{i}.moe.experts.w3": (experts, hidden, dim),
                f"layers.{i}.moe.experts.w2": (experts, dim, hidden),
                f"layers.{i}.moe.shared_expert.w1.weight": (m.mlp_hidden, dim),
                f"layers.{i}.moe.shared_expert.w3.weight": (m.mlp_hidden, dim),
                f"layers.{i}.moe.shared_expert.w2.weight": (dim, m.mlp_hidden),
            }
        )
    assert {name: tuple(t.shape) for name, t in model.state_dict().items()} == expected


@pytest.mark.slow
def test_launch_model_moe_trains_and_logs_moe_metrics(run_launch, tmp_path):
    run_dir = tmp_path / "run"
    result = run_launch(
        "model=moe",
        "trainer.max_steps=20",
        "trainer.eval_every=10",
        "trainer.batch_size=8",
        "data.max_bytes=1000000",
        "logger=[jsonl]",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [line for line in lines if "train/loss" in line]
    assert len(train) == 20
    losses = [line["train/loss"] for line in train]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    assert losses[0] == pytest.approx(math.log(256), abs=0.2)  # an untrained model is near uniform
    val = [line["val/loss"] for line in lines if "val/loss" in line]
    assert len(val) == 2 and val[1] < val[0]
    for line in train:
        loads = [line[f"moe/layer0/load/e{j}"] for j in range(4)]
        assert sum(loads) == pytest.approx(1.0)
        assert line["moe/layer0/drop_rate"] == 0.0  # the default is dropless
        assert line["moe/layer0/aux_loss"] > 0 and line["moe/layer0/z_loss"] > 0


def test_grouped_linear_is_a_well_formed_operator():
    """The custom operator's fake (shape) and autograd registrations agree with its kernel, groups empty or not."""
    torch.manual_seed(0)
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    counts = torch.tensor([2, 0, 5])
    torch.library.opcheck(torch.ops.currytrain.grouped_linear.default, (x, weight, counts))
    assert torch.autograd.gradcheck(lambda x, w: grouped_linear(x, w, counts), (x, weight))
    expected = torch.cat([x[:2] @ weight[0].t(), x[2:] @ weight[2].t()])
    torch.testing.assert_close(grouped_linear(x, weight, counts), expected, rtol=0, atol=1e-12)


def test_grouped_linear_under_autocast_computes_in_its_dtype():
    """A custom operator is not autocast by itself: the wrapper casts as F.linear would, so bf16 autocast gives
    F.linear's bf16 result rather than a dtype error."""
    torch.manual_seed(0)
    x, weight, counts = torch.randn(6, 8), torch.randn(2, 4, 8), torch.tensor([4, 2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = grouped_linear(x, weight, counts)
        expected = torch.cat([F.linear(x[:4], weight[0]), F.linear(x[4:], weight[1])])
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("capacity_factor", [0.0, 1.0])  # dropless (the grouped operator), padded with drops
def test_moe_forward_and_loss_trace_as_one_graph_equal_to_the_per_token_reference(capacity_factor):
    """torch.compile (fullgraph: any graph break raises) over a whole MoE model's forward, loss and auxiliary losses:
    one graph, whose layer output equals the per-token reference within 1e-5 and whose gradients equal eager's.
    aot_eager traces what inductor would compile (dynamo and the autograd graph) without the C++ compile."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = tiny_model(capacity_factor=capacity_factor).double()
    inputs, targets = torch.randint(32, (3, 10)), torch.randint(32, (3, 10))
    eager_task, eager_auxiliary = model_loss(model)(inputs, targets)
    eager_grads = torch.autograd.grad(eager_task.total + eager_auxiliary, list(model.parameters()))
    compiled = torch.compile(model_loss(model), backend="aot_eager", fullgraph=True)
    task, auxiliary = compiled(inputs, targets)
    grads = torch.autograd.grad(task.total + auxiliary, list(model.parameters()))
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    torch.testing.assert_close((task.total, task.count, auxiliary), (eager_task.total, eager_task.count, eager_auxiliary), rtol=0, atol=1e-10)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    layer = torch.compile(model.layers[0].moe, backend="aot_eager", fullgraph=True)
    x = torch.randn(30, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x), per_token_reference(model.layers[0].moe, x), rtol=0, atol=1e-5)
