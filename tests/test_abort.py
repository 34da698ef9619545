"""Abort conditions (conf/abort/): each trips on what it names, stop ends the run with exit code 4, and
rollback restores the last good checkpoint, skips the bad data and finishes the run."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from conftest import launch
from currytrain.abort.monitor import AbortMonitor
from currytrain.errors import Aborted
from currytrain.journal import read_journal
from currytrain.run import build_hooks, write_run_record
from currytrain.trainer.hooks import Action
from currytrain.trainer.trainer import Trainer


def _metrics(loss=2.0, grad_norm=1.0, tokens_per_s=1000.0, skipped=0.0, **extra):
    return {"train/loss": loss, "train/grad_norm": grad_norm, "train/tokens_per_s": tokens_per_s, "train/skipped": skipped, "train/tokens": 100.0, **extra}


def _feed(monitor, steps):
    return [monitor.after_step(step, metrics) for step, metrics in enumerate(steps, 1)]


def test_each_condition_trips_on_what_it_names_and_stays_quiet_otherwise():
    quiet = [_metrics(loss=2.0 - 0.01 * i, grad_norm=1.0 + 0.01 * (i % 3)) for i in range(60)]
    monitor = AbortMonitor(max_skipped_steps=3, loss_above=10, grad_spike_z=6, window=20, min_throughput_ratio=0.3, patience=3, metric="train/loss")
    assert all(d.action is Action.CONTINUE for d in _feed(monitor, quiet))
    cases = {
        "abort.non_finite_loss": (AbortMonitor(), [_metrics(loss=math.nan)]),
        "abort.max_skipped_steps": (AbortMonitor(max_skipped_steps=3), [_metrics(skipped=1.0)] * 3),
        "abort.loss_above": (AbortMonitor(loss_above=5.0, loss_above_after=2), [_metrics(loss=9.0), _metrics(loss=9.0)]),
        "abort.grad_spike_z": (AbortMonitor(grad_spike_z=6, window=20), quiet[:20] + [_metrics(grad_norm=50.0)]),
        "abort.min_throughput_ratio": (AbortMonitor(min_throughput_ratio=0.3, window=10), quiet[:10] + [_metrics(tokens_per_s=100.0)]),
        "abort.patience": (
            AbortMonitor(patience=2, metric="val/loss"),
            [_metrics(**{"val/loss": 3.0}), _metrics(), _metrics(**{"val/loss": 3.1}), _metrics(**{"val/loss": 3.05})],
        ),
        "abort.max_tokens": (AbortMonitor(max_tokens=250), [_metrics()] * 3),
    }
    for name, (monitor, steps) in cases.items():
        decisions = _feed(monitor, steps)
        assert [d.action for d in decisions[:-1]] == [Action.CONTINUE] * (len(steps) - 1), name
        assert decisions[-1].action is Action.STOP and decisions[-1].reason.startswith(name), (name, decisions[-1])


def test_rollback_is_limited_and_then_stops():
    monitor = AbortMonitor(action="rollback", max_rollbacks=2, rollback_lr_scale=0.5)
    decisions = _feed(monitor, [_metrics(loss=math.inf)] * 3)
    assert [d.action for d in decisions] == [Action.ROLLBACK, Action.ROLLBACK, Action.STOP]
    assert decisions[0].lr_scale == 0.5 and "after 2 rollbacks" in decisions[2].reason


def _run(compose_cfg, run_dir, *overrides):
    cfg = OmegaConf.load(write_run_record(compose_cfg(*overrides), run_dir, [], run_dir))
    trainer = Trainer(cfg, run_dir, hooks=build_hooks(cfg))
    return trainer, trainer.train


LONGER = ["trainer.max_steps=30", "trainer.eval_every=10", "trainer.eval_batches=4", "optimizer.lr=0.01", "trainer.log_every=5"]
POISON = ["model._target_=tests.faulty.PoisonedGQA", "+model.poison_at=14", "build.allow=[tests.faulty.PoisonedGQA]"]


@pytest.mark.slow
def test_a_nan_batch_is_rolled_back_and_the_run_ends_where_a_clean_one_does(compose_cfg, tmp_path, one_thread):
    clean = {seed: _run(compose_cfg, tmp_path / f"clean{seed}", *LONGER, f"seed={seed}")[1]() for seed in (0, 1)}
    trainer, train = _run(compose_cfg, tmp_path / "poisoned", *LONGER, *POISON, "abort=strict", "trainer.checkpoint_every=5")
    poisoned = train()
    (rollback,) = [e for e in read_journal(tmp_path / "poisoned" / "journal.jsonl") if e["type"] == "rollback"]
    # The NaN of step 14 is read back with step 15's (log_every=5): the run rolls back from 15, past both batches.
    assert (rollback["from_step"], rollback["step"], rollback["data_offset"]) == (15, 10, 5)
    assert rollback["reason"].startswith("abort.non_finite_loss: the train loss is nan at step 14") and rollback["lr_scale"] == 0.5
    assert trainer.step == 30 and math.isfinite(poisoned)
    seed_noise = abs(clean[0] - clean[1])
    assert abs(poisoned - clean[0]) <= max(seed_noise, 0.05), (poisoned, clean, seed_noise)


def test_with_action_stop_a_nan_batch_aborts_the_run(compose_cfg, tmp_path, one_thread):
    trainer, train = _run(compose_cfg, tmp_path, *LONGER, *POISON)  # abort=default stops
    with pytest.raises(Aborted, match="abort.non_finite_loss: the train loss is nan at step 14"):
        train()


@pytest.mark.slow
def test_the_default_abort_stops_a_diverged_run_with_exit_code_4(tmp_path):
    result = launch("model.init_std=1e38", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 4, result.stderr[-2000:]
    assert "abort.non_finite_loss" in result.stderr and "Traceback" not in result.stderr
    (abort,) = [e for e in read_journal(tmp_path / "journal.jsonl") if e["type"] == "abort"]
    assert "step 1: abort.non_finite_loss" in abort["message"]
