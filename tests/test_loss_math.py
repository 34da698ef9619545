"""The loss rule (docs/training.md, "How the loss is normalized"): a step's loss is the sum of every scored target's
loss over its microbatches and data-parallel ranks divided by their number, so one optimizer step on ragged masked
data is the same update however the batch is split; eval is token-weighted the same way, whatever its batching."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from conftest import compose_tiny, single_threaded
from currytrain.components import build_components
from currytrain.model.gqa import GQATransformer
from currytrain.model.moe import MoETransformer
from currytrain.model.protocol import LossSum, as_loss_sum, default_loss, model_loss, own_loss, task_loss
from currytrain.parallel.state import Normalization, ParallelState
from currytrain.trainer.step import run_accumulated_step
from currytrain.trainer.trainer import Trainer
from tests.ragged import MaskedTokenLoss, MeanLoss, PromptMaskedMean, PromptMaskedSum, RaggedTokens, SumCountLoss, zero_prompts

SEQ, VOCAB, BATCH = 16, 64, 8
RAGGED = (1, 2, 15, 14, 3, 13, 1, 1)
"""Scored targets of the 8 sequences: microbatches of 4 score 32 and 18, of 2 score 3, 29, 16 and 2."""


def _lm() -> GQATransformer:
    torch.manual_seed(0)
    return GQATransformer(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=64, max_seq_len=SEQ)


def _step(model: torch.nn.Module, data, num_micro: int, **options) -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """One SGD step (lr 1: the update is the gradient) of the step's BATCH sequences of `data` as `num_micro`
    microbatches: the parameters after it, the update, and the step's reported loss."""
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    micro = [data.batch("train", 0, index, BATCH // num_micro) for index in range(num_micro)]
    ignore = getattr(data, "ignore_index", -100)
    forward = model_loss(model, default_loss(ignore), data)
    normalization = Normalization(ignore_index=ignore, own=own_loss(model, data) is not None)
    result = run_accumulated_step(model, optimizer, micro, forward_loss=forward, normalization=normalization, **options)
    after = [p.detach().clone() for p in model.parameters()]
    return after, [a - b for a, b in zip(after, before)], result.loss


def _relative(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    num = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g - w) for g, w in zip(got, want)]))
    return float(num / torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(w) for w in want])))


def _whole_batch_loss(model: torch.nn.Module, data: RaggedTokens) -> float:
    """The rule computed by hand: every scored target's cross-entropy over the step's batch, averaged."""
    inputs, targets = data.batch("train", 0, 0, BATCH)
    with torch.no_grad():
        logits = model(inputs)
    mask = targets != data.ignore_index
    return float(torch.nn.functional.cross_entropy(logits[mask], targets[mask]))


DATA = {
    "default loss": lambda: RaggedTokens(SEQ, VOCAB, scored=RAGGED),
    "adapter's ignore_index -1": lambda: RaggedTokens(SEQ, VOCAB, ignore_index=-1, scored=RAGGED),
    "own loss: (sum, count)": lambda: SumCountLoss(SEQ, VOCAB, scored=RAGGED),
    "own loss: (per-target losses, mask)": lambda: MaskedTokenLoss(SEQ, VOCAB, scored=RAGGED),
    "own loss: a mean over the unignored targets": lambda: MeanLoss(SEQ, VOCAB, scored=RAGGED),
}


@pytest.mark.parametrize("form", list(DATA))
def test_one_step_on_ragged_masked_data_is_the_same_update_however_the_batch_is_split(form, one_thread):
    data = DATA[form]()
    whole_params, whole, whole_loss = _step(_lm(), data, 1)
    assert whole_loss == pytest.approx(_whole_batch_loss(_lm(), data), rel=1e-6)
    for num_micro in (2, 4, 8):
        params, update, loss = _step(_lm(), data, num_micro)
        assert _relative(update, whole) < 1e-5, f"{form}: {num_micro} microbatches moved the weights {_relative(update, whole):.3g} of the update away"
        assert _relative(params, whole_params) < 1e-6
        assert loss == pytest.approx(whole_loss, rel=1e-6)


def test_the_hf_loss_bug_case_is_fixed(one_thread):
    """transformers PR #34191: 4 sequences, 4 scored targets in one microbatch and 24 in the other. The mean of the
    two microbatch means (the step before the rule) moved the weights 1.01 of the whole update away from it (0.887
    on the model of issue 45)."""
    data = RaggedTokens(SEQ, VOCAB, scored=(2, 2, 12, 12))
    inputs, targets = data.batch("train", 0, 0, 4)
    micro = [(inputs[:2], targets[:2]), (inputs[2:], targets[2:])]
    assert [int((t != -100).sum()) for _, t in micro] == [4, 24]
    updates = []
    for batches in ([(inputs, targets)], micro):
        model = _lm()
        before = [p.detach().clone() for p in model.parameters()]
        run_accumulated_step(model, torch.optim.SGD(model.parameters(), lr=1.0), batches)
        updates.append([p.detach() - b for p, b in zip(model.parameters(), before)])
    assert _relative(updates[1], updates[0]) < 1e-5


def test_a_mask_of_the_models_own_is_weighted_right_when_it_says_what_it_scored(one_thread):
    """A model that ignores target id 0 (which the data does not mark as ignore_index): its (sum, count) trains on
    the rule; one number (its mean) cannot be weighted right (check=preflight's "loss normalization" catches it)."""
    data = zero_prompts(RaggedTokens(SEQ, VOCAB, scored=RAGGED))
    _, whole, _ = _step(PromptMaskedSum(_lm()), data, 1)
    _, split, _ = _step(PromptMaskedSum(_lm()), data, 4)
    assert _relative(split, whole) < 1e-5
    _, whole, _ = _step(PromptMaskedMean(_lm()), data, 1)
    _, split, _ = _step(PromptMaskedMean(_lm()), data, 4)
    assert _relative(split, whole) > 0.05


def test_one_number_on_targets_that_are_not_class_indices_is_said_once(caplog):
    """Regression targets: a step counts one per row, which it says once, with the fix."""

    class Regressor(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, x):
            return self.linear(x)

        def loss(self, prediction, targets):
            return ((prediction - targets) ** 2).mean()

    model, batch = Regressor(), (torch.randn(4, 3), torch.randn(4, 2))
    with caplog.at_level(logging.WARNING, logger="currytrain.model.protocol"):
        for _ in range(2):
            loss = task_loss(model)(model(batch[0]), batch)
    assert loss.count == 4 and float(loss.mean.detach()) == pytest.approx(float(((model(batch[0]) - batch[1]) ** 2).mean().detach()))
    said = [record.getMessage() for record in caplog.records if "returns one number" in record.getMessage()]
    assert len(said) == 1 and "return (sum, count)" in said[0], said


def test_the_loss_forms_of_the_protocol():
    targets = torch.tensor([[1, -100, 3], [-100, -100, 2]])
    assert as_loss_sum(torch.tensor(2.0), targets) == (torch.tensor(6.0), torch.tensor(3), True)
    assert as_loss_sum(torch.tensor(2.0), targets, summed=True).total == 2.0
    assert as_loss_sum((torch.tensor(5.0), 2), targets) == LossSum(torch.tensor(5.0), 2)
    losses, mask = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([True, False, True])
    assert as_loss_sum((losses, mask), targets) == (torch.tensor(5.0), torch.tensor(2), False)
    assert as_loss_sum(losses, targets) == (torch.tensor(7.0), 3, False)
    # a microbatch that scores nothing adds nothing (its mean is 0/0), not NaN
    assert as_loss_sum(torch.tensor(float("nan")), torch.full((2, 3), -100)) == (torch.tensor(0.0), torch.tensor(0), True)
    # bytes are class indices too: 156 is not -100
    assert int(as_loss_sum(torch.tensor(1.0), torch.tensor([0, 156, 255], dtype=torch.uint8)).count) == 3
    for malformed in [(losses, mask, mask), (losses, 3), (losses, torch.ones(2, 3, dtype=torch.bool)), (torch.tensor(5.0), mask)]:
        with pytest.raises(TypeError, match="return \\(sum, count\\)"):
            as_loss_sum(malformed, targets)


def test_bf16_autocast_with_a_loss_scaler_keeps_the_rule(one_thread):
    data = RaggedTokens(SEQ, VOCAB, scored=RAGGED)
    options = {"autocast_dtype": torch.bfloat16}
    _, whole, _ = _step(_lm(), data, 1, scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10), **options)
    _, split, _ = _step(_lm(), data, 4, scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10), **options)
    assert _relative(split, whole) < 2e-2, "bf16 rounds, but the mean of microbatch means would be ~1 away"


def test_a_compiled_forward_and_loss_keeps_the_rule(one_thread):
    data = RaggedTokens(SEQ, VOCAB, scored=RAGGED)
    results = []
    for num_micro in (1, 2):
        model = _lm()
        before = [p.detach().clone() for p in model.parameters()]
        forward = torch.compile(model_loss(model), backend="eager")  # dynamo traces the LossSum and the rule around it
        micro = [data.batch("train", 0, index, BATCH // num_micro) for index in range(num_micro)]
        run_accumulated_step(model, torch.optim.SGD(model.parameters(), lr=1.0), micro, forward_loss=forward)
        results.append([p.detach() - b for p, b in zip(model.parameters(), before)])
    assert _relative(results[1], results[0]) < 1e-5


def test_moe_balancing_is_averaged_over_the_microbatches(one_thread):
    """The auxiliary loss keeps its own normalization (a mean over each microbatch's tokens, averaged over the
    microbatches): a step of two copies of one microbatch is the step of that microbatch."""

    def moe() -> MoETransformer:
        torch.manual_seed(0)
        return MoETransformer(
            vocab_size=VOCAB, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, mlp_hidden=64, max_seq_len=SEQ, num_experts=4, top_k=2, expert_hidden=32
        )

    batch = RaggedTokens(SEQ, VOCAB, scored=RAGGED).batch("train", 0, 0, 4)
    updates = []
    for copies in (1, 2):
        model = moe()
        before = [p.detach().clone() for p in model.parameters()]
        run_accumulated_step(model, torch.optim.SGD(model.parameters(), lr=1.0), [batch] * copies)
        updates.append([p.detach() - b for p, b in zip(model.parameters(), before)])
    assert _relative(updates[1], updates[0]) < 1e-5


@pytest.mark.parametrize("layout", [(8, 1), (4, 2), (2, 4)])
def test_val_loss_is_token_weighted_whatever_the_eval_batching(layout, compose_cfg, tmp_path, one_thread):
    """The same 8 val sequences as 1x8, 2x4 or 4x2 batches give one val loss: every scored target's loss over all
    of them, not a mean of batch means (torchtitan PR #4167)."""
    batches, size = layout
    cfg = compose_cfg("logger=[jsonl]", f"trainer.eval_batches={batches}", f"trainer.batch_size={size}", "data.seq_len=32")
    data = RaggedTokens(32, 256, scored=(1, 30, 2, 29, 3, 31, 1, 28))
    parts = build_components(cfg, ParallelState(), data=data)
    trainer = Trainer(cfg, tmp_path, ParallelState(), components=parts)
    inputs, targets = data.batch("val", 0, 0, 8)
    with torch.no_grad():
        logits = parts.model(inputs)
    mask = targets != -100
    want = float(torch.nn.functional.cross_entropy(logits[mask], targets[mask]))
    assert math.isclose(trainer.evaluate(), want, rel_tol=1e-6)
    assert OmegaConf.select(cfg, "trainer.eval_batches") == batches


# ------------------------------------------------------------------- the ladder's probe of the rule (check=preflight)


def _preflight_parts(compose_cfg, *overrides: str, model=None, pad: bool | None = None):
    from currytrain.build import build
    from tests import plain_models

    cfg = compose_cfg("logger=[jsonl]", *overrides)
    data = build(cfg.data)
    if pad is not None:
        data = plain_models.padded(data, declare_pad=pad)
    return build_components(cfg, ParallelState(), data=data, model=model)


def test_the_probe_catches_a_models_own_masked_mean_and_names_the_cause(compose_cfg, one_thread):
    from currytrain.check.preflight.normalization import loss_normalization
    from currytrain.check.stage import Status
    from tests import plain_models

    parts = _preflight_parts(compose_cfg, model=plain_models.PlainLM(bug="masked_mean_loss"), pad=False)
    finding = loss_normalization(parts, 4)
    assert finding.status is Status.FAILED, finding
    assert "PlainLM.loss() returns one number per microbatch" in finding.cause and "return (sum, count)" in finding.fix, finding


@pytest.mark.parametrize(
    "what",
    ["gqa", "gqa on padding it declares", "plain model, its own (sum, count)", "plain model, unpadded data", "moe with a capacity", "spiking", "probe task"],
)
def test_the_probe_is_silent_on_healthy_models(what, compose_cfg, one_thread):
    from currytrain.check.preflight.normalization import loss_normalization
    from currytrain.check.stage import Status
    from tests import plain_models

    setups = {
        "gqa": lambda: _preflight_parts(compose_cfg),
        "gqa on padding it declares": lambda: _preflight_parts(compose_cfg, pad=True),
        "plain model, its own (sum, count)": lambda: _preflight_parts(compose_cfg, model=plain_models.PlainLM(), pad=False),
        "plain model, unpadded data": lambda: _preflight_parts(compose_cfg, model=plain_models.PlainLM()),
        "moe with a capacity": lambda: _preflight_parts(compose_cfg, "model=moe", "model.expert_hidden=32", "model.capacity_factor=1.0"),
        "spiking": lambda: _preflight_parts(compose_cfg, "model=spiking"),
        "probe task": lambda: _preflight_parts(compose_cfg, "data=probe", "data.task=induction"),
    }
    finding = loss_normalization(setups[what](), 4)
    assert finding.status in (Status.PASSED, Status.SKIPPED), finding
    if what != "moe with a capacity":
        assert finding.status is Status.PASSED, finding


# ------------------------------------------------------------- every parallel layout: 2 gloo workers, one step each

ONE_STEP = [
    "model.n_layers=2",
    "model.n_heads=4",
    "model.n_kv_heads=2",  # tp=2 splits the kv heads
    "data.seq_len=32",
    "trainer.max_steps=1",
    "trainer.batch_size=8",
    "trainer.eval_batches=1",  # the same 8 val sequences in every layout: 8 / batch_size batches
    "trainer.grad_clip=0",
    "logger=[jsonl]",
    "optimizer=sgd",
    "optimizer.lr=1.0",  # the update is the gradient
    "optimizer.momentum=0",
    "optimizer.nesterov=false",
    "optimizer.schedule.kind=constant",
    "optimizer.schedule.warmup_steps=0",
]
MOE = ["model=moe", "model.expert_hidden=32"]
LAYOUTS = {
    # name: (reference, overrides); every layout takes the same 8 sequences per step
    "ddp": ("single", ["parallel=ddp"]),
    "ddp 2x2 microbatches": ("single", ["parallel=ddp", "trainer.batch_size=4", "trainer.grad_accum=2", "trainer.eval_batches=2"]),
    "zero1": ("single", ["parallel=zero1"]),
    "zero2": ("single", ["parallel=zero2"]),
    "fsdp": ("single", ["parallel=fsdp", "trainer.batch_size=4", "trainer.grad_accum=2", "trainer.eval_batches=2"]),
    "hsdp": ("single", ["parallel=hsdp", "parallel.dp_replicate=2"]),
    "fabric": ("single", ["parallel=ddp", "parallel.runtime=fabric"]),
    "tp": ("single", ["parallel=tp"]),
    "cp": ("single", ["parallel=cp"]),
    "pp": ("single", ["parallel=pp", "trainer.batch_size=4", "trainer.grad_accum=2", "trainer.eval_batches=2"]),
    "ep": ("single moe", [*MOE, "parallel=ep"]),
    # the data's own loss ignores target 0, which it does not declare: the gradients are put right after the step
    "ddp, a loss counting its own targets": (
        "single, a loss counting its own targets",
        ["parallel=ddp", "trainer.batch_size=4", "trainer.grad_accum=2", "trainer.eval_batches=2"],
    ),
}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """One 2-worker launch takes one step and one eval in every layout; one process gives the references (the
    whole step as one microbatch, and as 4 microbatches)."""
    from tests.loss_worker import run_each, step_and_eval
    from tests.test_parallel import run_two_workers, write_resolved

    root = tmp_path_factory.mktemp("loss")
    results = {}
    with single_threaded():
        for name, overrides in {
            "single": [],
            "single 4 microbatches": ["trainer.batch_size=2", "trainer.grad_accum=4", "trainer.eval_batches=4"],
            "single moe": MOE,
            "single, a loss counting its own targets": [],
        }.items():
            results[name] = step_and_eval(compose_tiny(*ONE_STEP, *overrides), root / name, ParallelState())
        paths = [write_resolved(compose_tiny(*ONE_STEP, *overrides), root / name) for name, (_, overrides) in LAYOUTS.items()]
    run_two_workers(paths, run_each)
    for name in LAYOUTS:
        ranks = [torch.load(root / name / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
        # pipeline stages hold their own parts of the model: the ranks' parameters together are the whole
        results[name] = {key: {**ranks[1][key], **ranks[0][key]} for key in ("params", "update")} | {"loss": ranks[0]["loss"], "val": ranks[0]["val"]}
    return results


def _compare(got: dict, want: dict, what: str) -> None:
    assert set(got["params"]) == set(want["params"]), what
    names = sorted(want["params"])
    params = _relative([got["params"][n] for n in names], [want["params"][n] for n in names])
    update = _relative([got["update"][n] for n in names], [want["update"][n] for n in names])
    assert params < 1e-6, f"{what}: parameters {params:.3g} (relative) from one process's after the step"
    assert update < 1e-4, f"{what}: the update is {update:.3g} of one process's away from it"
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), f"{what}: step loss"
    assert got["val"] == pytest.approx(want["val"], rel=1e-5), f"{what}: val loss"


@pytest.mark.slow
def test_one_process_takes_the_same_step_in_one_or_four_microbatches(layouts):
    _compare(layouts["single 4 microbatches"], layouts["single"], "4 microbatches")


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_parallel_layout_takes_the_one_process_step_on_ragged_masked_data(layout, layouts):
    """2 ranks (and microbatches, pipeline stages, sequence shards, expert shards) whose shares of the step score
    different numbers of targets: the parameters after the step, the step's loss and the val loss are one process's."""
    reference, _ = LAYOUTS[layout]
    _compare(layouts[layout], layouts[reference], layout)
