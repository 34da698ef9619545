"""The validation ladder: each deliberately broken part is caught by the right stage with a message naming
the cause; the healthy families pass every gate; launch.py check=... writes report.md, PNGs, the journal
and exits 0 or 3."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import launch
from currytrain.build import build
from currytrain.check.ladder import run_ladder
from currytrain.check.preflight import Preflight
from currytrain.check.sanity import Sanity
from currytrain.check.skeleton import Skeleton
from currytrain.check.stage import StageContext, Status
from currytrain.components import build_components
from currytrain.errors import GateFailed
from currytrain.journal import Journal, read_journal
from currytrain.parallel.state import ParallelState
from currytrain.validate import validate
from tests import ladder_zoo, plain_models

SMALL_DATA = "data.max_bytes=300000"  # the stdlib corpus, cut so each build reads it in milliseconds


@pytest.fixture
def built(compose_cfg, tmp_path, one_thread):
    """built(*overrides) -> (Components, StageContext) for the TINY config, as a run builds them."""

    def _built(*overrides: str):
        cfg = compose_cfg(SMALL_DATA, "model.n_layers=2", *overrides)
        ctx = StageContext(cfg, ParallelState(), tmp_path, Journal(tmp_path / "journal.jsonl"))
        return ctx.build(), ctx

    return _built


@pytest.fixture
def plain(compose_cfg, tmp_path, one_thread):
    """plain(bug, pad=None) -> (Components, StageContext) around tests/plain_models.PlainLM carrying `bug`, on the
    TINY config's corpus (PaddedCorpus when pad is True/False: whether the adapter declares its pad id)."""

    def _plain(bug: str = "", pad: bool | None = None, model: str = "plain"):
        cfg = compose_cfg(SMALL_DATA)
        ctx = StageContext(cfg, ParallelState(), tmp_path, Journal(tmp_path / "journal.jsonl"))
        torch.manual_seed(0)
        data = build(cfg.data)
        if pad is not None:
            data = plain_models.padded(data, declare_pad=pad)
        built = plain_models.PlainLM(bug=bug) if model == "plain" else None  # None: the config's gqa, no loss of its own
        return build_components(cfg, ctx.state, data=data, model=built), ctx

    return _plain


def _finding(result, name):
    (finding,) = [f for f in result.findings if f.name == name]
    return finding


def _preflight(parts, ctx, step_fn=None):
    stage = Preflight()
    if step_fn is not None:
        stage.step_fn = step_fn
    return stage.assess(parts, ctx)


def _caught(result, name, *words):
    finding = _finding(result, name)
    assert finding.status is Status.FAILED, (finding, [f for f in result.findings if f.status is not Status.PASSED])
    for word in words:
        assert word in finding.cause, finding
    others = [f.name for f in result.failures() if f.name != name]
    return others


# ------------------------------------------------------------------------------------------------- the zoo


@pytest.mark.slow
def test_double_softmax_is_caught_by_skeleton_and_by_overfitting(built):
    parts, ctx = built()
    ladder_zoo.double_softmax(parts)
    _caught(Skeleton().assess(parts, ctx), "outputs are logits", "double softmax")
    sanity = Sanity(overfit_steps=30, stats_steps=1).assess(parts, ctx)
    _caught(sanity, "overfit one batch", "double softmax")
    assert _finding(sanity, "init loss").status is Status.PASSED, "a double softmax starts at chance: the init loss cannot see it"


def test_missing_zero_grad_is_caught_by_preflight(built):
    parts, ctx = built()
    result = _preflight(parts, ctx, step_fn=ladder_zoo.step_without_zero_grad)
    _caught(result, "zero_grad between steps", "zero_grad() is missing")
    assert "second/first gradient norm 2" in _finding(result, "zero_grad between steps").observed


def test_eval_mode_during_training_is_caught_by_preflight(built):
    parts, ctx = built()
    ladder_zoo.eval_mode_during_training(parts)
    _caught(_preflight(parts, ctx), "train/eval mode", "eval mode during training")


def test_dropout_left_on_in_eval_mode_is_caught_by_preflight(built):
    parts, ctx = built()
    ladder_zoo.dropout_in_eval_mode(parts)
    _caught(_preflight(parts, ctx), "train/eval mode", "active in eval mode")


def test_label_leaked_into_the_inputs_is_caught_by_preflight(built):
    parts, ctx = built()
    ladder_zoo.label_in_inputs(parts)
    _caught(_preflight(parts, ctx), "no label leakage", "labels leak into the inputs")


def test_non_causal_mask_is_caught_by_preflight(built, monkeypatch):
    parts, ctx = built()
    ladder_zoo.non_causal_mask(monkeypatch)
    _caught(_preflight(parts, ctx), "causality", "attention mask is not causal")


def test_zeroed_layer_is_a_dead_layer(built):
    parts, ctx = built()
    ladder_zoo.zeroed_layer(parts, index=1)
    result = _preflight(parts, ctx)
    _caught(result, "gradient flow", "dead layer", "layers.1")


def test_detached_block_cuts_the_gradient(built):
    parts, ctx = built()
    ladder_zoo.detached_block(parts, index=1)
    _caught(_preflight(parts, ctx), "gradient flow", "no gradient reaches", "layers.0")


@pytest.mark.slow
def test_init_scale_x100_is_caught_by_the_init_loss(built):
    parts, ctx = built("model.init_std=2.0")
    result = Sanity(overfit_steps=1, stats_steps=1).assess(parts, ctx)
    _caught(result, "init loss", "init scale")
    assert "model.init_std" in _finding(result, "init loss").fix


def test_lr_x1000_is_caught_by_one_step(built):
    parts, ctx = built("optimizer.lr=3.0")
    _caught(_preflight(parts, ctx), "one step lowers the loss", "too high")


def test_frozen_embedding_is_caught_and_can_be_allowed(built):
    parts, ctx = built()
    ladder_zoo.frozen_embedding(parts)
    _caught(_preflight(parts, ctx), "no frozen parameters", "tok_embeddings.weight")
    allowed = Preflight(allow_frozen=["tok_embeddings"]).assess(parts, ctx)
    assert _finding(allowed, "no frozen parameters").status is Status.PASSED


def test_val_split_that_repeats_train_is_caught(built):
    parts, ctx = built()
    ladder_zoo.val_is_train(parts)
    _caught(_preflight(parts, ctx), "no train/val overlap", "repeats the train data")


def test_a_mixtures_splits_are_compared_source_by_source(built):
    """data.sources (a MixedStream per split) is compared too, not skipped: a source whose val repeats its train
    fails; a clean mixture does not."""
    from currytrain.check.preflight.leakage import train_val_overlap
    from currytrain.data.streams import MixedStream

    parts, _ = built()
    data = parts.data
    train, val, half = data.train, data.val, len(data.train) // 2
    data.train, data.val = MixedStream([train[:half], train[half:]], [1, 1]), MixedStream([val[: len(val) // 2], val[len(val) // 2 :]], [1, 1])
    clean = train_val_overlap(parts, windows=32, max_share=0.2)
    assert clean.status in (Status.PASSED, Status.WARNING) and "val windows" in clean.observed, clean  # 32 bytes: some boilerplate
    data.val = MixedStream([val, train[half : half + len(val)].clone()], [1, 1])  # the second source's val is its train
    leaky = train_val_overlap(parts, windows=32, max_share=0.2)
    assert leaky.status is Status.FAILED and "repeats the train data" in leaky.cause, leaky


# ------------------------------------------------------------- the zoo, widened: plain PyTorch models (issue 25)


def _clean(result, *allowed):
    """No finding failed or warned, except those named."""
    alarms = [f for f in result.findings if f.status in (Status.WARNING, Status.FAILED) and f.name not in allowed]
    assert not alarms, alarms


def test_a_plain_model_with_its_own_loss_groups_and_blocks_climbs_without_an_alarm(plain):
    parts, ctx = plain()
    assert [f"h.{i}" for i in range(2)] == [name for name, _ in ladder_zoo.blocks(parts)], "blocks found, not read from model.layers"
    assert parts.optimizer.param_groups[0]["weight_decay"] == 0.1 and parts.optimizer.param_groups[1]["weight_decay"] == 0.0, "its own groups"
    _clean(Skeleton().assess(parts, ctx))
    _clean(_preflight(parts, ctx))
    sanity = Sanity(overfit_steps=150).assess(parts, ctx)
    _clean(sanity)
    assert "| h.1 |" in sanity.details and "nan" not in sanity.details


@pytest.mark.parametrize("model", ["plain", "gqa"])
def test_padding_the_loss_ignores_is_no_leak(plain, model):
    """The plain model's own loss ignores the pad id (0); the adapter declares it for a model with no loss of its own."""
    parts, ctx = plain(pad=model == "gqa", model=model)
    leak = _finding(_preflight(parts, ctx), "no label leakage")
    assert leak.status is Status.PASSED, leak
    assert ("writes target 0" in leak.observed) is (model == "plain"), "a declared ignore_index is no filler; the model's own ignore index is seen as one"


def test_padding_counted_in_the_loss_through_the_adapter_is_caught_as_padding(plain):
    parts, ctx = plain(pad=False, model="gqa")
    result = _preflight(parts, ctx)
    _caught(result, "no label leakage", "padding counted in the loss")
    assert "targets copied" not in _finding(result, "no label leakage").cause


def test_blocks_that_learn_100x_slower_are_caught_by_their_group_lr(plain):
    parts, ctx = plain("slow_blocks")
    finding = _finding(_preflight(parts, ctx), "learning rates")
    assert finding.status is Status.WARNING and "h.0" in finding.cause and "learn that much slower" in finding.cause, finding


def test_a_norm_that_hides_vanishing_gradients_is_caught_by_the_block_gradients(plain):
    parts, ctx = plain("norm_hides_vanishing")
    sanity = Sanity(overfit_steps=1).assess(parts, ctx)
    finding = _finding(sanity, "layer gradients")
    assert finding.status is Status.WARNING and "vanish" in finding.cause, finding
    assert _finding(sanity, "layer activations").status is Status.PASSED, "the norm keeps the activations looking healthy"


def test_functional_dropout_left_on_in_eval_is_caught_once_with_its_cause(plain):
    parts, ctx = plain("eval_dropout")
    result = _preflight(parts, ctx)
    others = _caught(result, "train/eval mode", "active in eval mode")
    assert others == [], "the causality probe seeds the RNG: the dropout masks match and the mask is causal"
    assert _finding(result, "causality").status is Status.PASSED


def test_a_parameter_missing_from_its_own_groups_is_blamed_on_the_groups_not_on_zero_grad(plain):
    parts, ctx = plain("missing_from_optimizer")
    result = _preflight(parts, ctx)
    _caught(result, "optimizer coverage", "param_groups() leaves them out")
    zero_grad = _finding(result, "zero_grad between steps")
    assert zero_grad.status is Status.PASSED or zero_grad.consequence_of == "optimizer coverage", zero_grad
    assert "zero_grad() is missing" not in zero_grad.cause


def test_an_update_of_the_wrong_sign_is_not_told_to_lower_the_lr(plain):
    parts, ctx = plain("gradient_reversal")
    result = _preflight(parts, ctx)
    _caught(result, "one step lowers the loss", "does not descend at any lr")
    assert "too high" not in _finding(result, "one step lowers the loss").cause


def test_a_loss_of_the_wrong_sign_is_caught_as_such(plain):
    parts, ctx = plain("negated_loss")
    result = _preflight(parts, ctx)
    _caught(result, "loss sign", "wrong sign")
    assert _finding(result, "no label leakage").consequence_of == "loss sign", "not read as leaked labels"


# ---------------------------------------------------------------------------------------- healthy families


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gqa", "moe", "spiking"])
def test_healthy_families_pass_every_gate(model, compose_cfg, tmp_path, one_thread):
    cfg = compose_cfg(f"model={model}", "check=sanity", SMALL_DATA, "model.n_layers=2", "logger=[jsonl]")
    results = run_ladder(cfg, ParallelState(), tmp_path, Journal(tmp_path / "journal.jsonl"))
    assert [r.stage for r in results] == ["skeleton", "preflight", "sanity"]
    for result in results:
        assert result.status is not Status.FAILED, result.failures()
    events = [e for e in read_journal(tmp_path / "journal.jsonl") if e["type"] == "check"]
    assert [e["stage"] for e in events] == ["skeleton", "preflight", "sanity"]
    assert (tmp_path / "report.md").is_file() and (tmp_path / "sanity_overfit.png").is_file()


# ------------------------------------------------------------------------------------------ the machinery


def test_the_ladder_stops_at_the_first_failed_gate(compose_cfg, tmp_path, one_thread):
    cfg = compose_cfg("check=sanity", SMALL_DATA, "optimizer.lr=3000", "logger=[jsonl]")
    with pytest.raises(GateFailed, match="stage preflight failed its gate") as failed:
        run_ladder(cfg, ParallelState(), tmp_path, Journal(tmp_path / "journal.jsonl"))
    assert "one step lowers the loss" in str(failed.value) and "fix: lower optimizer.lr" in str(failed.value)
    assert failed.value.exit_code == 3
    stages = [e["stage"] for e in read_journal(tmp_path / "journal.jsonl") if e["type"] == "check"]
    assert stages == ["skeleton", "preflight"]
    report = (tmp_path / "report.md").read_text()
    assert "| sanity | not run (an earlier gate failed) |" in report and "## preflight: failed" in report


@pytest.mark.slow
def test_a_user_stage_plugs_in_from_config(compose_cfg, tmp_path, one_thread):
    overrides = (
        "check=skeleton",
        SMALL_DATA,
        "build.allow=[tests.ladder_zoo.CountingStage]",
        "+check.stages.count={_target_:tests.ladder_zoo.CountingStage,minimum:10}",
    )
    cfg = compose_cfg(*overrides, "logger=[jsonl]")
    assert validate(cfg) == []
    results = run_ladder(cfg, ParallelState(), tmp_path, Journal(tmp_path / "journal.jsonl"))
    assert [r.stage for r in results] == ["skeleton", "count"]
    assert "## count: passed" in (tmp_path / "report.md").read_text()
    too_big = compose_cfg(*overrides[:-1], "+check.stages.count={_target_:tests.ladder_zoo.CountingStage,minimum:1000000000}", "logger=[jsonl]")
    with pytest.raises(GateFailed, match="parameter count"):
        run_ladder(too_big, ParallelState(), tmp_path / "big", Journal(tmp_path / "big" / "journal.jsonl"))


def test_the_example_stage_in_experiments_runs_from_the_command_line_override(compose_cfg, tmp_path, one_thread):
    stage = "+check.stages.param_budget={_target_:experiments.param_budget.ParamBudget,max_params:1000}"
    cfg = compose_cfg("check=skeleton", SMALL_DATA, stage, "logger=[jsonl]")
    with pytest.raises(GateFailed, match="parameter budget"):
        run_ladder(cfg, ParallelState(), tmp_path, Journal(tmp_path / "journal.jsonl"))


def test_stage_thresholds_are_validated_with_their_key(compose_cfg):
    problems = validate(compose_cfg("check=sanity", "check.stages.preflight.max_overlap=2", "check.stages.sanity.overfit_steps=0"))
    assert any(p.startswith("check.stages.preflight.max_overlap=2.0 must be in [0, 1]") for p in problems), problems
    assert any(p.startswith("check.stages.sanity.overfit_steps=0 must be >= 1") for p in problems), problems


@pytest.mark.slow
def test_launch_check_sanity_writes_report_figures_journal_and_histograms(tmp_path):
    run_dir = tmp_path / "run"
    result = launch("check=sanity", SMALL_DATA, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "validation ladder" in result.stdout and "overfit one batch" in result.stdout
    report = (run_dir / "report.md").read_text()
    for section in ("## skeleton: passed", "## preflight:", "## sanity:", "![sanity_overfit](sanity_overfit.png)"):
        assert section in report
    import matplotlib.image

    for png in ("sanity_overfit.png", "sanity_layers.png"):
        image = matplotlib.image.imread(run_dir / png)
        assert image.shape[0] > 100 and image.shape[1] > 100
    assert [e["stage"] for e in read_journal(run_dir / "journal.jsonl") if e["type"] == "check"] == ["skeleton", "preflight", "sanity"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"histograms": 0}).Reload()
    assert "check/activation/layers.0" in events.Tags()["histograms"]
    texts = [json.loads(line)["name"] for line in (run_dir / "metrics.text.jsonl").read_text().splitlines()]
    assert texts == ["check/skeleton", "check/preflight", "check/sanity"]


@pytest.mark.slow
def test_launch_a_failed_gate_exits_3_and_is_journaled(tmp_path):
    run_dir = tmp_path / "run"
    result = launch("check=preflight", SMALL_DATA, "optimizer.lr=3000", f"hydra.run.dir={run_dir}")
    assert result.returncode == 3, result.stderr[-3000:]
    assert "one step lowers the loss" in result.stderr and "Traceback" not in result.stderr
    (gate,) = [e for e in read_journal(run_dir / "journal.jsonl") if e["type"] == "gate_failed"]
    assert gate["error"] == "GateFailed"
    assert "## preflight: failed" in (run_dir / "report.md").read_text()
