"""Activation checkpointing: same gradients as without it, blocks really recomputed, checkpoints portable."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hydra.errors import InstantiationException
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from currytrain.benchmark import build_step_setup
from currytrain.build import build
from currytrain.model.config import APPLIED_FROM_OUTSIDE, DecoderConfig
from currytrain.model.gqa import Block, GQATransformer
from currytrain.model.protocol import HasAuxiliaryLoss, causal_lm_loss
from currytrain.parallel.parallelize import apply_ac
from currytrain.validate import validate

# The debug size (conf/model/size/debug.yaml).
DEBUG = dict(vocab_size=256, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, mlp_hidden=384, max_seq_len=128)
AC_SETTINGS = {
    "full": ("full", "block", 1),
    "selective-block-every-2": ("selective", "block", 2),
    "selective-op": ("selective", "op", 1),
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def debug_model():
    torch.manual_seed(0)
    return GQATransformer(**DEBUG)


def _batch(seed: int = 0, batch: int = 2, seq_len: int = 32):
    tokens = torch.randint(0, DEBUG["vocab_size"], (batch, seq_len + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def _loss_and_grads(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    inputs, targets = _batch()
    loss = causal_lm_loss(model(inputs), targets)
    loss.backward()
    # state_dict() names, not named_parameters(): the wrappers keep the former unchanged.
    names = {id(tensor): name for name, tensor in model.state_dict(keep_vars=True).items()}
    return loss.detach(), {names[id(p)]: p.grad for p in model.parameters()}


def _count_block_forwards(model: GQATransformer) -> list[int]:
    counts = [0] * len(model.layers)
    for index, block in enumerate(model.layers):
        block.register_forward_pre_hook(lambda module, args, index=index: counts.__setitem__(index, counts[index] + 1))
    return counts


@pytest.mark.parametrize("setting", list(AC_SETTINGS))
def test_gradients_equal_without_ac_and_blocks_are_recomputed(setting, debug_model):
    reference_loss, reference = _loss_and_grads(copy.deepcopy(debug_model))

    model = copy.deepcopy(debug_model)
    counts = _count_block_forwards(model)
    mode, policy, every = AC_SETTINGS[setting]
    apply_ac(model, mode, policy, every)
    loss, grads = _loss_and_grads(model)

    wrapped = [isinstance(layer, CheckpointWrapper) for layer in model.layers]
    expected_wrapped = [index % every == 0 for index in range(len(model.layers))]
    assert wrapped == expected_wrapped
    # A checkpointed block runs forward again during backward; the others run once.
    assert counts == [2 if is_wrapped else 1 for is_wrapped in wrapped]
    assert torch.equal(loss, reference_loss)
    assert grads.keys() == reference.keys()
    for name, grad in grads.items():
        assert (grad - reference[name]).abs().max().item() <= 1e-6, name


def test_op_policy_recomputes_fewer_ops_than_full(debug_model):
    """ac_policy=op keeps matmul outputs, so its backward re-runs the elementwise ops but no matmul."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMatmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.mm = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.mm += func is torch.ops.aten.mm.default
            return func(*args, **(kwargs or {}))

    counted = {}
    for mode, policy in (("none", "block"), ("full", "block"), ("selective", "op")):
        model = copy.deepcopy(debug_model)
        apply_ac(model, mode, policy)
        inputs, targets = _batch()
        loss = causal_lm_loss(model(inputs), targets)
        with CountMatmuls() as counter:
            loss.backward()
        counted[mode] = counter.mm
    # Full AC replays each block's projections (up to the last saved tensor it needs; w2's output is not one).
    assert counted["full"] >= counted["none"] + 6 * DEBUG["n_layers"]
    assert counted["selective"] == counted["none"]


def test_checkpoints_load_across_ac_modes(debug_model):
    plain = copy.deepcopy(debug_model)
    checkpointed = copy.deepcopy(debug_model)
    apply_ac(checkpointed, "full")
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    torch.manual_seed(1)
    other = GQATransformer(**DEBUG)
    checkpointed.load_state_dict(other.state_dict())
    inputs, _ = _batch()
    with torch.no_grad():
        assert torch.equal(checkpointed(inputs), other(inputs))


def test_fields_applied_from_outside_are_decoder_fields_and_not_constructor_arguments(compose_cfg):
    assert set(APPLIED_FROM_OUTSIDE) <= set(DecoderConfig.__dataclass_fields__)
    cfg = compose_cfg("model.ac=selective", "model.ac_policy=block", "model.ac_every=1")
    with pytest.raises(InstantiationException, match="unexpected keyword argument 'ac'"):
        build(cfg.model)  # the plain build passes them to the constructor, which rejects them
    model = build_step_setup(cfg).model
    assert all(isinstance(layer, CheckpointWrapper) for layer in model.layers)
    assert isinstance(model.layers[0]._checkpoint_wrapped_module, Block)


def test_apply_ac_needs_blocks_in_model_layers():
    with pytest.raises(TypeError, match="model.layers"):
        apply_ac(torch.nn.Sequential(torch.nn.Linear(2, 2)), "full")


def test_bad_ac_settings_are_reported_with_key_and_fix(compose_cfg):
    problems = validate(compose_cfg("model.ac=partial", "model.ac_policy=layer", "model.ac_every=0"))
    assert any("model.ac=partial is not one of ['none', 'full', 'selective']: pass model.ac=full" in p for p in problems), problems
    assert any("model.ac_policy=layer is not one of ['block', 'op']" in p for p in problems), problems
    assert any("model.ac_every=0 must be >= 1" in p and "pass model.ac_every=2" in p for p in problems), problems
    assert validate(compose_cfg("model.ac=selective", "model.ac_policy=op")) == []


@pytest.mark.slow
def test_a_run_trains_with_selective_op_ac(run_launch, tmp_path):
    result = run_launch("model.ac=selective", "model.ac_policy=op", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    events = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
    finish = [event for event in events if event.get("type") == "finish"]
    assert finish and finish[0]["step"] == 6


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gqa", "moe", "spiking"])
def test_every_decoder_family_gets_the_same_gradients_under_ac(family, compose_cfg):
    """parallelize_decoder relies only on model.layers, so each family's gradients (auxiliary losses included) hold."""
    settings = {"none": ["model.ac=none"], "full": ["model.ac=full"], "op": ["model.ac=selective", "model.ac_policy=op"]}
    results = {}
    for name, overrides in settings.items():
        cfg = compose_cfg(f"model={family}", "model.n_layers=2", *overrides)
        model = build_step_setup(cfg).model  # seeded by cfg.seed: the same weights for every setting
        assert all(isinstance(layer, CheckpointWrapper) for layer in model.layers) == (name != "none")
        inputs, targets = _batch(seq_len=16)
        loss = causal_lm_loss(model(inputs), targets)
        if isinstance(model, HasAuxiliaryLoss):
            loss = loss + model.auxiliary_loss()
        loss.backward()
        names = {id(tensor): key for key, tensor in model.state_dict(keep_vars=True).items()}
        results[name] = (loss.detach(), {names[id(p)]: p.grad for p in model.parameters()})
    reference_loss, reference = results["none"]
    for name in ("full", "op"):
        loss, grads = results[name]
        assert torch.equal(loss, reference_loss), name
        assert grads.keys() == reference.keys()
        for key, grad in grads.items():
            assert (grad - reference[key]).abs().max().item() <= 1e-6, (name, key)
