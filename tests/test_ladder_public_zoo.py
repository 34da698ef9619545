"""The second zoo: bugs from the public record (tests/public_zoo.py), each planted in a plain-PyTorch GPT or its data
adapter the way it happened, each named with its cause by the cheapest probe that catches it. The whole ladder over
every bug at several seeds (with the right-cause rate) is bench/ladder_calibration.py --part zoo; here each bug meets
its own probe once, and the healthy control meets every new probe without an alarm."""

from __future__ import annotations

import pytest
import torch

from currytrain.build import build
from currytrain.check.preflight.modes import causality
from currytrain.check.preflight.objective import distinct_data, loss_alignment, scored_tokens
from currytrain.check.preflight.routing import routing_balance
from currytrain.check.preflight.state import decayed_parameters, forward_state, residual_growth, tied_weights
from currytrain.check.probes import get_batch, train_step
from currytrain.check.resume import Resume
from currytrain.check.stage import Finding, StageContext, Status
from currytrain.components import build_components
from currytrain.journal import Journal
from currytrain.parallel.state import ParallelState
from tests import public_zoo

SMALL_DATA = "data.max_bytes=300000"


def _probe(name: str, parts) -> Finding:
    batch = get_batch(parts, 4)
    run = {
        "loss scores the next token": lambda: loss_alignment(parts, batch),
        "every token is scored": lambda: scored_tokens(parts, [get_batch(parts, 4, step=index) for index in range(4)]),
        "weight decay": lambda: decayed_parameters(parts),
        "train mode after eval": lambda: forward_state(parts, batch)[1],
        "state across forwards": lambda: forward_state(parts, batch)[0],
        "init scale with depth": lambda: residual_growth(parts, batch, 3.0),
        "tied weights": lambda: tied_weights(parts, train_step, batch),
        "distinct data per rank and microbatch": lambda: distinct_data(parts, 4),
        "routing balance": lambda: routing_balance(parts, batch),
        "causality": lambda: causality(parts, batch, 1e-4),
    }
    return run[name]()


def _parts_of(cfg, bug: str = "", **model):
    """Components around the control carrying `bug` (on EOS-ended documents cut from the TINY corpus), seeded by cfg.seed."""
    torch.manual_seed(cfg.seed)
    gpt, data_bug = public_zoo.build(bug, **model) if bug else (public_zoo.GPT(**model), "")
    return build_components(cfg, ParallelState(), data=public_zoo.documents(build(cfg.data), data_bug), model=gpt)


@pytest.fixture
def zoo(compose_cfg, tmp_path, one_thread):
    """zoo(bug, **model) -> (Components, StageContext) around the public zoo's control carrying `bug`."""

    def _zoo(bug: str = "", **model):
        cfg = compose_cfg(SMALL_DATA, "logger=[jsonl]")
        ctx = StageContext(cfg, ParallelState(), tmp_path, Journal(tmp_path / "journal.jsonl"))
        return _parts_of(cfg, bug, **model), ctx

    return _zoo


PREFLIGHT_BUGS = [name for name, bug in public_zoo.BUGS.items() if bug.stage == "preflight"]


def test_the_zoo_cites_each_bug_and_covers_the_categories_of_the_issue():
    assert len(public_zoo.BUGS) >= 15
    for bug in public_zoo.BUGS.values():
        assert "#" in bug.source and "/" in bug.source, f"{bug.name}: cite project/repository and issue or PR number"
    probes = {bug.probe for bug in public_zoo.BUGS.values()}
    for category in ("loss scores the next token", "every token is scored", "weight decay", "train mode after eval", "init scale with depth"):
        assert category in probes
    for category in ("tied weights", "distinct data per rank and microbatch", "routing balance", "state across forwards", "resume equivalence"):
        assert category in probes


@pytest.mark.parametrize("bug", PREFLIGHT_BUGS)
def test_a_public_bug_is_named_by_its_probe(zoo, bug):
    planted = public_zoo.BUGS[bug]
    parts, _ = zoo(bug)
    finding = _probe(planted.probe, parts)
    assert finding.status in (Status.WARNING, Status.FAILED), finding
    for word in planted.words:
        assert word in finding.cause, finding


@pytest.mark.parametrize("model", [{}, {"moe": True}, {"positions": "rope", "actnorm": "buffer"}])
def test_the_healthy_control_raises_no_alarm_in_the_new_probes(zoo, model):
    """A false alarm is as bad as a missed bug: the control (and its MoE and rotary variants) passes or skips each probe."""
    parts, _ = zoo(**model)
    for probe in {bug.probe for bug in public_zoo.BUGS.values() if bug.stage == "preflight"}:
        finding = _probe(probe, parts)
        assert finding.status in (Status.PASSED, Status.SKIPPED), finding
    if model.get("moe"):
        assert _probe("routing balance", parts).status is Status.PASSED, "a balancing loss that responds"


def test_a_flag_outside_the_state_dict_breaks_resume_equivalence_and_a_buffer_keeps_it(zoo, compose_cfg, tmp_path):
    """bayesiains/nflows #4: with ActNorm's `initialized` as a plain attribute the resumed run re-runs the data-dependent
    init; registered as a buffer, the resumed run is the uninterrupted one, bit for bit."""
    _, ctx = zoo()
    stage = Resume(steps=4)
    results = {}
    for flag in ("attribute", "buffer"):
        stage.build = lambda config, state, flag=flag: _parts_of(config, actnorm=flag)
        ctx.run_dir = tmp_path / flag
        (finding,) = stage.run(ctx).findings
        results[flag] = finding
    assert results["buffer"].status is Status.PASSED, results["buffer"]
    assert results["attribute"].status is Status.FAILED and "actnorm.scale" in results["attribute"].observed, results["attribute"]
    assert "the losses part at step 3" in results["attribute"].observed, "identical up to the checkpoint, apart after it"
    assert not (tmp_path / "buffer" / "resume" / "resumed" / "checkpoints").exists(), "the probe's checkpoints are removed"


def test_a_block_that_stochastic_depth_skips_on_one_seed_is_no_cut_gradient(zoo):
    """LayerDrop skips a block in some forwards: the gradient-flow probe asks other seeds before it calls the block cut
    off (one backward alone would have named it, the zoo's seed 0 of layerdrop_python_rng did)."""
    from currytrain.check.preflight.wiring import gradient_flow

    parts, _ = zoo(dropout=0.0)
    block = parts.model.h[1]
    forward = block.forward
    block.forward = lambda x: x if block.training and float(torch.rand(())) < 0.5 else forward(x)  # seed 0 draws 0.50: skipped
    finding = gradient_flow(parts, get_batch(parts, 4))
    assert finding.status is Status.PASSED, finding
    block.forward = lambda x: forward(x).detach()  # cut off on every seed
    assert gradient_flow(parts, get_batch(parts, 4)).status is Status.FAILED
