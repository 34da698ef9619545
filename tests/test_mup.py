"""muP: mup=false is today's model; mup=true scales init, logits, attention and per-layer LRs so that
activations after training stay the same size at every width."""

from __future__ import annotations

import math

import pytest
import torch

from currytrain.benchmark import build_step_setup
from currytrain.errors import ConfigError
from currytrain.model import build_model
from currytrain.model.gqa import GQATransformer
from currytrain.model.protocol import causal_lm_loss
from currytrain.optim.builders import build_adamw, build_sgd
from currytrain.validate import validate

DEBUG = dict(vocab_size=256, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, mlp_hidden=384, max_seq_len=128)


pytestmark = pytest.mark.usefixtures("one_thread")


def _tokens(batch: int, seq_len: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 256, (batch, seq_len + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def test_mup_off_is_the_model_of_before_mup():
    """Fingerprint of the debug model (seed 0) taken at commit 60fdbbb, before muP existed: same draws, same logits."""
    torch.manual_seed(0)
    model = GQATransformer(**DEBUG)
    assert model.width_multiplier == 1.0 and all(block.attention.softmax_scale is None for block in model.layers)
    matrices_sumsq = sum(p.double().pow(2).sum() for p in model.parameters() if p.dim() == 2).item()
    assert matrices_sumsq == pytest.approx(248.85169728902116, rel=1e-9)
    expected_first = {
        "layers.0.attention.wo.weight": [0.0010862250346690416, -0.003441579407081008, 0.002373390831053257],
        "layers.3.mlp.w2.weight": [0.0013517369516193867, -0.0017100004479289055, 0.004911028780043125],
        "output.weight": [0.002248469041660428, 0.004933313000947237, -0.009614049457013607],
    }
    state = model.state_dict()
    for name, values in expected_first.items():
        assert state[name].flatten()[:3].tolist() == pytest.approx(values, rel=1e-6), name
    with torch.no_grad():
        logits = model(torch.arange(32).reshape(2, 16))
    assert logits[0, 0, :3].tolist() == pytest.approx([-0.049402400851249695, -0.3455168604850769, -0.17580059170722961], rel=1e-4)
    assert logits[1, -1, :3].tolist() == pytest.approx([-0.17817330360412598, 0.12836241722106934, -0.051611896604299545], rel=1e-4)
    assert logits.double().pow(2).mean().item() == pytest.approx(0.04606012962506806, rel=1e-5)


def test_mup_at_its_base_width_trains_exactly_like_mup_off():
    """Hyperparameters tuned without muP at the base width carry over unchanged."""
    runs = []
    for mup in (False, True):
        torch.manual_seed(0)
        model = GQATransformer(**DEBUG, mup=mup, mup_base_width=DEBUG["dim"])
        optimizer = build_adamw(model, lr=1e-2, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1)
        inputs, targets = _tokens(2, 16)
        for _ in range(2):
            causal_lm_loss(model(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad():
            runs.append((model.state_dict(), model(inputs)))
    (plain_state, plain_logits), (mup_state, mup_logits) = runs
    assert all(torch.equal(plain_state[name], mup_state[name]) for name in plain_state)
    assert torch.equal(plain_logits, mup_logits)


def test_mup_learning_rates_reach_the_optimizer_param_groups(compose_cfg):
    cfg = compose_cfg("model.mup=true", "model.dim=128", "model.mup_base_width=32", "model.n_layers=2", "optimizer.lr=0.01")
    parts = build_step_setup(cfg)
    model, optimizer = parts.model, parts.optimizer
    width = 128 / 32
    lr, weight_decay = cfg.optimizer.lr, cfg.optimizer.weight_decay
    # initial_lr: what the optimizer builder set, before the schedule's warmup scales every group alike.
    assert [group["initial_lr"] for group in optimizer.param_groups] == pytest.approx([lr, lr, lr / width])
    assert [group["weight_decay"] for group in optimizer.param_groups] == pytest.approx([weight_decay, 0.0, weight_decay * width])
    hidden = {id(module.weight) for block in model.layers for module in block.modules() if isinstance(module, torch.nn.Linear)}
    assert {id(p) for p in optimizer.param_groups[2]["params"]} == hidden and len(hidden) == 7 * 2
    base_lr = {id(p) for group in optimizer.param_groups[:2] for p in group["params"]}
    assert {id(model.tok_embeddings.weight), id(model.output.weight), id(model.norm.weight)} <= base_lr
    # The schedule scales every group by the same factor, so the muP ratio holds at every step.
    for _ in range(3):
        optimizer.step()
        parts.scheduler.step()
        group_lrs = [group["lr"] for group in optimizer.param_groups]
        assert group_lrs[2] == pytest.approx(group_lrs[0] / width)


def test_mup_off_keeps_the_two_param_groups(compose_cfg):
    cfg = compose_cfg("model.dim=128", "model.mup_base_width=32")
    optimizer = build_step_setup(cfg).optimizer
    assert len(optimizer.param_groups) == 2 and all(group["initial_lr"] == cfg.optimizer.lr for group in optimizer.param_groups)


def test_mup_scales_logits_attention_and_hidden_init():
    base, dim, n_heads = 64, 512, 4
    width = dim / base
    torch.manual_seed(0)
    model = GQATransformer(256, dim, 2, n_heads, 2, 3 * dim, 16, mup=True, mup_base_width=base)
    readout = {}
    model.output.register_forward_hook(lambda module, args, out: readout.__setitem__("raw", out))
    with torch.no_grad():
        logits = model(_tokens(2, 16)[0])
    torch.testing.assert_close(logits, readout["raw"] * (base / dim), rtol=1e-6, atol=0)
    head_dim = dim // n_heads
    # 1/head_dim as width grows, equal to 1/sqrt(head_dim) at the base width.
    assert model.layers[0].attention.softmax_scale == pytest.approx(math.sqrt(head_dim / width) / head_dim)
    init_std = 0.02
    block = model.layers[0]
    assert block.attention.wq.weight.std().item() == pytest.approx(init_std / math.sqrt(width), rel=0.02)
    assert block.mlp.w2.weight.std().item() == pytest.approx(init_std / math.sqrt(2 * 2) / math.sqrt(width), rel=0.02)
    assert model.tok_embeddings.weight.std().item() == pytest.approx(init_std, rel=0.02)
    assert model.output.weight.std().item() == pytest.approx(init_std, rel=0.02)


def _activation_sizes_after_training(mup: bool, widths=(64, 128, 256), steps: int = 5, lr: float = 1e-2) -> dict[str, list[float]]:
    """RMS of the residual stream (the final norm's input) and of the logits after `steps` AdamW steps, per width."""
    sizes = {"stream": [], "logits": []}
    inputs, targets = _tokens(8, 32)
    for width in widths:
        torch.manual_seed(0)
        model = GQATransformer(256, width, 2, 4, 2, 3 * width, 32, mup=mup, mup_base_width=widths[0])
        optimizer = build_adamw(model, lr=lr, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.0)
        for _ in range(steps):
            causal_lm_loss(model(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()
        captured = {}
        model.norm.register_forward_hook(lambda module, args, out, captured=captured: captured.__setitem__("stream", args[0]))
        with torch.no_grad():
            logits = model(inputs)
        sizes["stream"].append(captured["stream"].pow(2).mean().sqrt().item())
        sizes["logits"].append(logits.pow(2).mean().sqrt().item())
    return sizes


def _spread(sizes: list[float]) -> float:
    return max(sizes) / min(sizes)


@pytest.mark.slow
def test_coordinate_check_activations_are_width_invariant_under_mup():
    standard = _activation_sizes_after_training(mup=False)
    mup = _activation_sizes_after_training(mup=True)
    # Measured (widths 64/128/256): the stream grows ~70x under the standard parameterisation (Adam's
    # updates add up over fan-in) and ~1.2x under muP; the logits ~5x and ~1.3x.
    assert standard["stream"] == sorted(standard["stream"]), standard
    assert _spread(standard["stream"]) > 10 and _spread(mup["stream"]) < 2, (standard, mup)
    assert _spread(mup["stream"]) < _spread(standard["stream"]) / 5
    assert _spread(standard["logits"]) > 3 and _spread(mup["logits"]) < 2, (standard, mup)


@pytest.mark.slow
def test_bad_mup_settings_are_reported_with_key_and_fix(compose_cfg):
    problems = validate(compose_cfg("model.mup=true", "model.mup_base_width=0"))
    assert any("model.mup_base_width=0 must be >= 1" in p and "model.mup_base_width=32" in p for p in problems), problems
    problems = validate(compose_cfg("model.mup=true", "optimizer=sgd"))
    assert any("model.mup=true sets Adam's per-layer learning rates" in p and "pass optimizer=adamw" in p for p in problems), problems
    assert validate(compose_cfg("model.mup=false", "optimizer=sgd")) == []
    assert validate(compose_cfg("model.mup=true", "model.mup_base_width=16")) == []


def test_sgd_refuses_a_mup_model():
    model = GQATransformer(256, 64, 1, 4, 2, 128, 16, mup=True, mup_base_width=32)
    with pytest.raises(ConfigError, match="optimizer=adamw"):
        build_sgd(model, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gqa", "moe", "spiking"])
def test_every_decoder_family_implements_mup(family, compose_cfg):
    """At its base width a muP model is the standard one; wider, every matrix inside the blocks trains at
    lr/width_multiplier and the logits carry 1/width_multiplier."""
    sizes = [f"model={family}", "model.n_heads=4", "model.n_kv_heads=2"]
    inputs, _ = _tokens(2, 16)
    runs = []
    for mup in ("false", "true"):
        cfg = compose_cfg(*sizes, "model.dim=64", "model.mlp_hidden=128", f"model.mup={mup}", "model.mup_base_width=64")
        torch.manual_seed(0)
        model = build_model(cfg.model)
        with torch.no_grad():
            runs.append((model.state_dict(), model(inputs)))
    (plain_state, plain_logits), (mup_state, mup_logits) = runs
    assert all(torch.equal(plain_state[name], mup_state[name]) for name in plain_state)
    assert torch.equal(plain_logits, mup_logits)

    cfg = compose_cfg(*sizes, "model.dim=128", "model.mlp_hidden=256", "model.mup=true", "model.mup_base_width=32")
    parts = build_step_setup(cfg)
    model, optimizer = parts.model, parts.optimizer
    assert optimizer.param_groups[2]["initial_lr"] == pytest.approx(cfg.optimizer.lr / 4)
    in_blocks = {id(p) for p in model.layers.parameters() if p.dim() >= 2}
    assert {id(p) for p in optimizer.param_groups[2]["params"]} == in_blocks
    assert sum(len(group["params"]) for group in optimizer.param_groups) == len(list(model.parameters()))
    readout = {}
    model.output.register_forward_hook(lambda module, args, out: readout.__setitem__("raw", out))
    with torch.no_grad():
        logits = model(inputs)
    torch.testing.assert_close(logits, readout["raw"] * (32 / 128), rtol=1e-6, atol=0)


def test_a_mup_model_is_not_exported_to_hugging_face(compose_cfg, tmp_path):
    pytest.importorskip("transformers")
    from omegaconf import OmegaConf

    from currytrain.hf.convert import write_hf

    node = OmegaConf.to_container(compose_cfg("model.mup=true").model, resolve=True)
    with pytest.raises(ConfigError, match="model.mup=true"):
        write_hf(node, {}, tmp_path / "hf")
