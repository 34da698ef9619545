"""run_accumulated_step: accumulation equals one big batch, clipping (by torch or inside the fused optimizer), skipping non-finite steps; the benchmarks' turn-taking."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from currytrain.benchmark import alternating_step_times, balanced_orders, run_accumulated_step
from currytrain.model.gqa import GQATransformer
from currytrain.model.protocol import causal_lm_loss
from currytrain.trainer import step
from currytrain.trainer.step import grad_norm, optimizer_step


def _model() -> GQATransformer:
    torch.manual_seed(0)
    return GQATransformer(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=64, max_seq_len=16)


def _capture_grads(optimizer: torch.optim.Optimizer, into: dict) -> None:
    """Record the gradients the optimizer sees at step time (run_accumulated_step clears them after)."""

    def hook(opt, args, kwargs):
        into["grads"] = [p.grad.detach().clone() for group in opt.param_groups for p in group["params"]]

    optimizer.register_step_pre_hook(hook)


def test_accumulated_microbatches_give_the_gradients_of_one_big_batch():
    inputs = torch.randint(64, (8, 16), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(64, (8, 16), generator=torch.Generator().manual_seed(2))
    results = {}
    for num_micro in (1, 4):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        seen: dict = {}
        _capture_grads(optimizer, seen)
        micro = list(zip(inputs.chunk(num_micro), targets.chunk(num_micro)))
        result = run_accumulated_step(model, optimizer, micro)
        results[num_micro] = (result, seen["grads"])
    (one, grads_one), (four, grads_four) = results[1], results[4]
    max_diff = max((a - b).abs().max().item() for a, b in zip(grads_one, grads_four))
    assert max_diff <= 1e-6, max_diff
    assert abs(one.loss - four.loss) < 1e-6
    assert one.num_tokens == four.num_tokens == 8 * 16


def test_clipping_bounds_the_gradient_norm_and_reports_the_norm_before():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    seen: dict = {}
    _capture_grads(optimizer, seen)
    batch = (torch.randint(64, (4, 16)), torch.randint(64, (4, 16)))
    result = run_accumulated_step(model, optimizer, [batch], grad_clip=1e-3)
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in seen["grads"]]))
    assert result.grad_norm > 1e-3
    assert abs(clipped.item() - 1e-3) < 1e-6


@pytest.fixture(params=["host", "device"])
def check_on(request, monkeypatch):
    """The finiteness check of the CPU (read on the host) and of an accelerator (found_inf, on the device: run
    here on the CPU's kernels)."""
    if request.param == "device":
        monkeypatch.setattr(step, "read_without_waiting", lambda tensor: False)
    return request.param


@pytest.mark.parametrize("grad_clip", [1e-3, 1e3, 0.0])
def test_the_fused_optimizer_clips_in_its_kernel_as_clip_grad_norm_then_a_step_would(grad_clip, check_on):
    """Fused AdamW gets the clipping as its grad_scale divisor: the same parameters and moments as torch's
    clip_grad_norm_ followed by the step (clipping engaged, not engaged, off), and nothing left on the optimizer."""
    batch = (torch.randint(64, (4, 16), generator=torch.Generator().manual_seed(3)), torch.randint(64, (4, 16), generator=torch.Generator().manual_seed(4)))
    ours, reference = _model(), _model()
    ours_opt = torch.optim.AdamW(ours.parameters(), lr=1e-2, fused=True)
    reference_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True)
    for _ in range(2):
        result = run_accumulated_step(ours, ours_opt, [batch], grad_clip=grad_clip)
        inputs, targets = batch
        causal_lm_loss(reference(inputs), targets).backward()
        norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), grad_clip if grad_clip > 0 else float("inf"))
        reference_opt.step()
        reference_opt.zero_grad(set_to_none=True)
        assert abs(result.grad_norm - norm.item()) <= 1e-6 * norm.item()
    assert norm.item() > 1e-3 and (grad_clip != 1e3 or norm.item() < 1e3)  # the cases are what they say
    for a, b in zip(ours.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours_opt.state[a]["exp_avg"], reference_opt.state[b]["exp_avg"], rtol=1e-5, atol=1e-8)
    assert not hasattr(ours_opt, "grad_scale") and not hasattr(ours_opt, "found_inf")


def test_grad_norm_on_the_cpu_is_torchs_total_norm_to_the_bit():
    """The CPU path takes torch._foreach_norm instead of get_total_norm's Python loop: the same number, over
    mixed dtypes, with parameters that have no gradient skipped."""
    torch.manual_seed(0)
    shapes = [(64, 32), (32,), (7, 3, 5), (1000,)]
    parameters = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes] + [torch.nn.Parameter(torch.randn(9, dtype=torch.bfloat16))]
    for param in parameters[:2] + parameters[3:]:
        param.grad = torch.randn_like(param) * 3
    expected = torch.nn.utils.get_total_norm([param.grad for param in parameters if param.grad is not None])
    assert torch.equal(grad_norm(parameters), expected)
    parameters[0].grad[3, 4] = float("inf")
    assert grad_norm(parameters).isinf()


def test_optimizer_step_hands_the_fused_kernel_found_inf_for_one_call():
    """The accelerator's path: a set found_inf makes fused AdamW leave parameters, moments and the step count."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for found_inf, changes in ((torch.ones(()), False), (torch.zeros(()), True)):
        before = [p.detach().clone() for p in model.parameters()]
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        optimizer_step(optimizer, found_inf, torch.tensor(2.0))
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())) == changes
        assert not hasattr(optimizer, "found_inf") and not hasattr(optimizer, "grad_scale")
    assert all(state["step"].item() == 1 for state in optimizer.state.values())


@pytest.mark.parametrize("fused", [False, True])
def test_non_finite_gradients_skip_the_optimizer_step(fused, check_on):
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    batch = (torch.randint(64, (4, 16)), torch.randint(64, (4, 16)))
    result = run_accumulated_step(model, optimizer, [batch], loss_fn=lambda logits, targets: logits.sum() * float("nan"))
    assert result.skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    good = run_accumulated_step(model, optimizer, [batch])
    assert not good.skipped
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(state["step"].item() == 1 for state in optimizer.state.values())  # the skipped step was not counted


def test_alternating_step_times_takes_balanced_turns_and_times_every_call_after_the_warm_up():
    calls = []
    times = alternating_step_times({name: lambda step, name=name: calls.append((name, step)) for name in "abc"}, rounds=3, warmup=1)
    assert [name for name, _ in calls] == list("abcbcacabcba")
    assert sorted(calls)[:4] == [("a", 0), ("a", 1), ("a", 2), ("a", 3)]  # each round's step index, whatever the order
    assert {name: len(seconds) for name, seconds in times.items()} == {"a": 3, "b": 3, "c": 3}
    calls.clear()
    alternating_step_times({name: lambda step, name=name: calls.append(name) for name in "ab"}, rounds=2, offset=1)
    assert calls == list("baab")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_balanced_orders_put_each_first_and_after_each_other_equally_often(n):
    orders = balanced_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    firsts = Counter(order[0] for order in orders)
    assert set(firsts) == set(range(n)) and len(set(firsts.values())) == 1
    pairs = Counter((a, b) for order in orders for a, b in zip(order, order[1:]))
    assert len(pairs) == n * (n - 1) and len(set(pairs.values())) <= 1  # every ordered pair, each as often
