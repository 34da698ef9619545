"""model=spiking: LIF dynamics against hand-computed trajectories, surrogate gradients against their
formulas, causality and training through launch.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import launch
from currytrain.model import build_model
from currytrain.model.config import SPIKE_SURROGATES
from currytrain.model.spiking import LIF, SpikingTransformer, lif_scan

NEURON_NAMES = ("attn_input", "q", "k", "v", "attn", "mlp_input", "mlp")


def tiny_model(**overrides) -> SpikingTransformer:
    kwargs = dict(vocab_size=32, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, mlp_hidden=24, max_seq_len=12, timesteps=3)
    kwargs.update(overrides)
    torch.manual_seed(0)
    return SpikingTransformer(**kwargs)


# --- The neuron ---------------------------------------------------------------------------------------


def test_lif_spikes_are_exactly_zero_or_one():
    torch.manual_seed(0)
    current = torch.randn(6, 4, 50) * 3  # wide range: far below, at and far above threshold
    for reset in ("soft", "hard"):
        spikes = LIF(tau=2.0, threshold=1.0, reset=reset, surrogate="atan", slope=2.0)(current)
        assert set(spikes.unique().tolist()) == {0.0, 1.0}


def test_model_spikes_are_binary_and_rates_are_their_means():
    model = tiny_model()
    seen: dict[str, torch.Tensor] = {}
    for index, layer in enumerate(model.layers):
        for name, lif in layer.neurons().items():
            lif.register_forward_hook(lambda _m, _i, out, key=f"spiking/layer{index}/{name}_rate": seen.__setitem__(key, out))
    model(torch.randint(0, 32, (2, 12)))
    assert len(seen) == 2 * len(NEURON_NAMES)
    metrics = model.training_metrics()
    for key, spikes in seen.items():
        assert spikes.shape[0] == 3, "spike trains carry the timestep axis first"
        assert set(spikes.unique().tolist()) <= {0.0, 1.0}, key
        assert metrics[key] == pytest.approx(spikes.mean().item())
    assert 0 < metrics["spiking/mean_rate"] < 1


def test_soft_and_hard_reset_follow_the_hand_computed_trajectories():
    # tau=2 keeps half the membrane each step; threshold 1; the neuron fires when h >= 1.
    current = torch.tensor([0.5, 0.75, 1.75, 0.75, 0.0], dtype=torch.float64).view(5, 1)
    # soft: h = 0.5, 1.0 (fires, v=0), 1.75 (fires, v=0.75), 0.375+0.75=1.125 (fires, v=0.125), 0.0625
    # hard: h = 0.5, 1.0 (fires, v=0), 1.75 (fires, v=0), 0.75, 0.375
    expected = {
        "soft": ([0, 1, 1, 1, 0], [0.5, 0.0, 0.75, 0.125, 0.0625]),
        "hard": ([0, 1, 1, 0, 0], [0.5, 0.0, 0.0, 0.75, 0.375]),
    }
    for reset, (spikes_expected, membrane_expected) in expected.items():
        spikes, membrane = lif_scan(current, tau=2.0, threshold=1.0, reset=reset, surrogate="sigmoid", slope=4.0, return_membrane=True)
        assert spikes.flatten().tolist() == spikes_expected, reset
        assert membrane.flatten().tolist() == pytest.approx(membrane_expected), reset


def test_tau_sets_the_leak():
    # tau=4 keeps 3/4 per step: 0.5, 0.875, 1.15625 -> fires on the third step (soft: v = 0.15625).
    current = torch.full((3, 1), 0.5, dtype=torch.float64)
    spikes, membrane = lif_scan(current, tau=4.0, threshold=1.0, reset="soft", surrogate="atan", slope=2.0, return_membrane=True)
    assert spikes.flatten().tolist() == [0, 0, 1]
    assert membrane.flatten().tolist() == pytest.approx([0.5, 0.875, 0.15625])
    # tau=1 keeps nothing: 0.5 every step never reaches the threshold.
    spikes = lif_scan(current, tau=1.0, threshold=1.0, reset="soft", surrogate="atan", slope=2.0)
    assert spikes.sum() == 0


def sigmoid_formula(x: float, a: float) -> float:
    return a * math.exp(-a * x) / (1 + math.exp(-a * x)) ** 2


def atan_formula(x: float, a: float) -> float:
    return a / (2 + 2 * (math.pi * a * x / 2) ** 2)


def triangle_formula(x: float, a: float) -> float:
    return max(0.0, a - a * a * abs(x))


FORMULAS = {"sigmoid": sigmoid_formula, "atan": atan_formula, "triangle": triangle_formula}


@pytest.mark.parametrize("surrogate", SPIKE_SURROGATES)
def test_spike_gradient_is_the_surrogate_derivative(surrogate):
    threshold, slope = 0.8, 2.5
    current = torch.tensor([-1.0, 0.2, 0.5, 0.75, 0.8, 0.85, 1.1, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    # One timestep from rest: the membrane equals the input current.
    spikes = lif_scan(current.view(1, -1), tau=2.0, threshold=threshold, reset="soft", surrogate=surrogate, slope=slope)
    assert spikes.flatten().tolist() == [float(c >= threshold) for c in current.tolist()]
    spikes.sum().backward()
    expected = [FORMULAS[surrogate](c - threshold, slope) for c in current.tolist()]
    assert current.grad.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert current.grad[4].item() == pytest.approx(slope * {"sigmoid": 0.25, "atan": 0.5, "triangle": 1.0}[surrogate])


def test_gradient_flows_back_through_the_leak():
    # Two steps, no spike at t=1: h2 = decay * I1 + I2, so d s2 / d I1 = decay * surrogate'(h2 - threshold).
    current = torch.tensor([[0.4], [0.5]], dtype=torch.float64, requires_grad=True)
    spikes = lif_scan(current, tau=2.0, threshold=1.0, reset="soft", surrogate="atan", slope=2.0)
    spikes[1].sum().backward()
    h2 = 0.5 * 0.4 + 0.5
    assert current.grad[0].item() == pytest.approx(0.5 * atan_formula(h2 - 1.0, 2.0))
    assert current.grad[1].item() == pytest.approx(atan_formula(h2 - 1.0, 2.0))


def test_bad_neuron_settings_are_rejected():
    with pytest.raises(ValueError, match="surrogate"):
        tiny_model(surrogate="relu")
    with pytest.raises(ValueError, match="reset"):
        tiny_model(reset="zero")
    with pytest.raises(ValueError, match="timesteps"):
        tiny_model(timesteps=0)


# --- The decoder --------------------------------------------------------------------------------------


def test_logits_depend_only_on_the_past():
    model = tiny_model(reset="hard", surrogate="triangle")
    tokens = torch.randint(0, 32, (2, 12))
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 32
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert before.shape == (2, 12, 32)
    torch.testing.assert_close(before[:, :7], after[:, :7], rtol=0, atol=0)
    assert not torch.equal(before[:, 7:], after[:, 7:])


def test_every_parameter_gets_a_gradient():
    model = tiny_model()
    tokens = torch.randint(0, 32, (2, 12))
    torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.roll(-1, 1).flatten()).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


@pytest.mark.slow
def test_config_builds_the_model_and_validation_names_each_bad_field(compose_cfg):
    from currytrain.validate import validate

    cfg = compose_cfg("model=spiking", tiny=False)
    assert validate(cfg) == []
    assert isinstance(build_model(cfg.model), SpikingTransformer)
    bad = {
        "model.timesteps": "0",
        "model.tau": "0.5",
        "model.threshold": "0",
        "model.reset": "zero",
        "model.surrogate": "relu",
        "model.surrogate_slope": "-1",
    }
    problems = validate(compose_cfg("model=spiking", *[f"{key}={value}" for key, value in bad.items()], tiny=False))
    assert len(problems) == len(bad)
    for key, value in bad.items():
        assert any(problem.startswith(f"{key}={value}") and f": pass {key}=" in problem for problem in problems), key
    assert any("['sigmoid', 'atan', 'triangle']" in problem for problem in problems)


def test_launch_trains_and_logs_spike_rates(tmp_path):
    run_dir = tmp_path / "run"
    overrides = (
        "model=spiking trainer.max_steps=30 optimizer.schedule.warmup_steps=3 trainer.eval_every=15 "
        "trainer.eval_batches=4 trainer.batch_size=8 trainer.log_every=1 trainer.progress=false"
    ).split()
    # One intra-op thread: on a shared 2-core machine, two OpenMP threads competing with other jobs spin
    # and run >10x slower; one thread keeps this test near 20 s either way (the losses are identical).
    result = launch(*overrides, f"hydra.run.dir={run_dir}", tiny=False, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    evals = [r for r in records if "val/loss" in r]
    assert train[0]["step"] == 1 and evals[-1]["step"] == 30
    # An untrained byte model sits near ln(256) = 5.55 nats; 30 steps must take it well below.
    assert train[0]["train/loss"] > 5.0
    assert evals[-1]["val/loss"] < train[0]["train/loss"] - 1.5
    for record in (train[0], train[-1]):
        for layer in range(4):  # the debug size has 4 layers
            for name in NEURON_NAMES:
                assert 0.0 <= record[f"spiking/layer{layer}/{name}_rate"] <= 1.0
        assert 0.01 < record["spiking/mean_rate"] < 0.9, "neurons all silent or all firing"
