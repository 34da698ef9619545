"""The validation ladder: each deliberately broken part is caught by the right stage with a message naming
the cause; the healthy families pass every gate; launch.py check=... writes report.md, PNGs, the journal
and exits 0 or 3."""

from __future__ import annotations

import json

import pytest

from conftest import launch
from currytrain.check.ladder import run_ladder
from currytrain.check.preflight import Preflight
from currytrain.check.sanity import Sanity
from currytrain.check.skeleton import Skeleton
from currytrain.check.stage import StageContext, Status
from currytrain.errors import GateFailed
from currytrain.journal import Journal, read_journal
from currytrain.parallel.state import ParallelState
from currytrain.validate import validate
from tests import ladder_zoo

SMALL_DATA = "data.max_bytes=300000"  # the stdlib corpus, cut so each build reads it in milliseconds


@pytest.fixture
def built(compose_cfg, tmp_path, one_thread):
    """built(*overrides) -> (Components, StageContext) for the TINY config, as a run builds them."""

    def _built(*overrides: str):
        cfg = compose_cfg(SMALL_DATA, "model.n_layers=2", *overrides)
        ctx = StageContext(cfg, ParallelState(), tmp_path, Journal(tmp_path / "journal.jsonl"))
        return ctx.build(), ctx

    return _built


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
    overrides = ("check=skeleton", SMALL_DATA, "build.allow=[tests]", "+check.stages.count={_target_:tests.ladder_zoo.CountingStage,minimum:10}")
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
