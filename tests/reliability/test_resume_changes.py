"""A resume under a config that differs from the checkpoint's: what cannot be applied exits 2 naming each difference
and the fix; trainer.resume_mode=weights keeps the weights alone; what can be applied is applied, printed and
journaled, with the tokens seen counted exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import launch
from currytrain.journal import read_journal
from currytrain.optim.builders import lr_multiplier
from reliability.runs import weights

SEQ = 32  # TINY's model.max_seq_len, the data's seq_len
BASE = ("logger=[jsonl]", "trainer.checkpoint_every=2", "trainer.keep_last=10", "optimizer.schedule.warmup_steps=2")


def files(run_dir) -> dict:
    return {path: path.stat().st_mtime_ns for path in run_dir.rglob("*") if path.is_file() and path.name != "run.lock"}


@pytest.fixture(scope="module")
def adamw_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("resume_changes") / "run"
    result = launch(*BASE, "trainer.max_steps=4", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def sgd_resumes(adamw_run):
    """The AdamW run resumed with optimizer=sgd: refused, then with trainer.resume_mode=weights (lr 1e-9: SGD barely
    moves, so step 8 holds the weights of step 4, which were loaded rather than freshly drawn)."""
    before = files(adamw_run)
    refused = launch(*BASE, "optimizer=sgd", "trainer.max_steps=8", "trainer.resume=auto", f"hydra.run.dir={adamw_run}")
    after = files(adamw_run)
    resumed = launch(
        *BASE, "optimizer=sgd", "optimizer.lr=1e-9", "trainer.max_steps=8", "trainer.resume=auto", "trainer.resume_mode=weights", f"hydra.run.dir={adamw_run}"
    )
    return refused, before == after, resumed


@pytest.mark.reliability(
    fault="resume with another optimizer",
    protection="exit 2 naming the difference and the fix; trainer.resume_mode=weights loads the weights alone and journals it",
)
@pytest.mark.slow
def test_another_optimizer_is_refused_with_the_fix_and_resume_mode_weights_keeps_only_the_weights(adamw_run, sgd_resumes):
    refused, untouched, resumed = sgd_resumes
    assert refused.returncode == 2, refused.stderr[-3000:]
    message = refused.stderr
    assert "optimizer._target_=currytrain.optim.builders.build_adamw (its state: exp_avg, exp_avg_sq)" in message, message
    assert "pass optimizer=adamw" in message and "trainer.resume_mode=weights" in message and "Traceback" not in message
    assert untouched, "a refused resume writes nothing"

    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = read_journal(adamw_run / "journal.jsonl")
    resume = [r for r in records if r["type"] == "resume"][0]
    assert resume["mode"] == "weights" and resume["step"] == 4 and resume["optimizer"] == "fresh" and resume["tokens"] == 4 * 4 * SEQ
    assert "steps 5-8" in resume["schedule"]
    changed = [r for r in records if r["type"] == "changed_on_resume"][0]["changes"]
    assert changed["optimizer._target_"] == {"checkpoint": "currytrain.optim.builders.build_adamw", "now": "currytrain.optim.builders.build_sgd"}
    assert sorted({r["step"] for r in records if r["type"] == "metrics" and 4 < r["step"] <= 8}) == [5, 6, 7, 8]
    old, new = weights(adamw_run, 4), weights(adamw_run, 8)
    assert old.keys() == new.keys() and all(torch.allclose(old[k], new[k], rtol=0, atol=1e-6) for k in old)
    marker = json.loads((adamw_run / "checkpoints" / "step_8" / "COMPLETE").read_text())
    assert marker["config"]["optimizer"]["_target_"].endswith("build_sgd") and marker["tokens"] == 8 * 4 * SEQ


@pytest.mark.reliability(
    fault="resume with another batch size, grad_accum and lr", protection="applied, printed and journaled (changed_on_resume, both values); tokens seen exact"
)
def test_a_changed_batch_and_lr_are_applied_printed_journaled_and_the_tokens_seen_stay_exact(adamw_run, sgd_resumes):
    assert sgd_resumes[2].returncode == 0, "this resume continues the SGD run's step 8"
    result = launch(
        *BASE,
        "optimizer=sgd",
        "optimizer.lr=0.05",
        "trainer.batch_size=8",
        "trainer.grad_accum=2",
        "trainer.max_steps=10",
        "trainer.resume=auto",
        f"hydra.run.dir={adamw_run}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    for line in (
        "changed on resume: trainer.batch_size 4 -> 8",
        "changed on resume: trainer.grad_accum 1 -> 2",
        "changed on resume: optimizer.lr 1e-09 -> 0.05",
    ):
        assert line in output, output[-3000:]
    records = read_journal(adamw_run / "journal.jsonl")
    changed = [r for r in records if r["type"] == "changed_on_resume"][-1]
    assert changed["step"] == 8 and changed["tokens"] == 8 * 4 * SEQ
    assert changed["changes"]["trainer.batch_size"] == {"checkpoint": 4, "now": 8} and changed["changes"]["trainer.grad_accum"] == {"checkpoint": 1, "now": 2}
    assert changed["changes"]["trainer.max_steps"] == {"checkpoint": 8, "now": 10}
    assert [r for r in records if r["type"] == "resume"][-1]["mode"] == "full"
    metrics = {r["step"]: r for r in records if r["type"] == "metrics" and r["step"] > 8}
    assert metrics[10]["train/tokens_seen"] == 8 * 4 * SEQ + 2 * 8 * 2 * SEQ, "tokens of each segment at its own batch"
    assert metrics[9]["train/tokens"] == 8 * 2 * SEQ
    # The new peak lr (the checkpoint's was 1e-9) at this step of the schedule the weights-only resume restarted at
    # step 4, now ending at the new max_steps.
    expected = 0.05 * lr_multiplier(8 - 4, 10 - 4, "cosine", 2, 0.1)
    assert math.isclose(metrics[9]["train/lr"], expected, rel_tol=1e-6), (metrics[9]["train/lr"], expected)
    assert json.loads((adamw_run / "checkpoints" / "step_10" / "COMPLETE").read_text())["tokens"] == metrics[10]["train/tokens_seen"]
