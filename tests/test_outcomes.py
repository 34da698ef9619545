"""Typed outcomes: jobs raise, launch.py alone maps them to exit codes, and every way a run ends is journaled."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from conftest import launch
from currytrain.errors import Aborted, Pruned
from currytrain.journal import read_journal
from currytrain.run import write_run_record
from currytrain.trainer.hooks import Action, Decision
from currytrain.trainer.trainer import Trainer
from tests.faulty import CrashingLogger


def _events(run_dir, kind):
    return [event for event in read_journal(run_dir / "journal.jsonl") if event["type"] == kind]


def test_a_bad_value_fails_its_own_multirun_job_and_the_other_job_still_runs(tmp_path):
    result = launch("-m", "model.n_kv_heads=1,3", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "model.n_kv_heads=3 does not divide model.n_heads=2" in result.stderr
    assert "Traceback" not in result.stderr
    good, bad = tmp_path / "0", tmp_path / "1"
    assert _events(good, "finish"), "the good job must run to the end"
    assert not (bad / "journal.jsonl").exists() or not _events(bad, "finish")


@pytest.mark.slow
def test_a_crash_is_journaled_with_its_traceback_and_exits_1(tmp_path):
    run_dir = tmp_path / "run"
    result = launch("build.allow=[tests.faulty.CrashingLogger]", "+logger.crash={_target_:tests.faulty.CrashingLogger,fail_at:3}", f"hydra.run.dir={run_dir}")
    assert result.returncode == 1, result.stderr[-3000:]
    (failure,) = _events(run_dir, "failure")
    assert failure["error"] == "RuntimeError" and "logger exploded at step 3" in failure["message"]
    assert "log_metrics" in failure["traceback"]
    assert not _events(run_dir, "finish")


@pytest.mark.slow
def test_a_final_val_loss_that_is_not_finite_fails_the_run(tmp_path):
    run_dir = tmp_path / "run"
    result = launch("model.init_std=1e38", "abort=none", f"hydra.run.dir={run_dir}")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "the final val loss is nan" in result.stderr
    assert "Traceback" not in result.stderr and "HYDRA_FULL_ERROR" not in result.stderr
    assert _events(run_dir, "failure") and not _events(run_dir, "finish")


class StopAt:
    def __init__(self, step: int, action: Action):
        self.step, self.action, self.seen = step, action, []

    def after_step(self, step, metrics):
        self.seen.append((step, "val/loss" in metrics))
        first_time = [seen for seen, _ in self.seen].count(step) == 1
        return Decision(self.action, "told to") if step == self.step and first_time else Decision()


def _trainer(compose_cfg, run_dir, *overrides, hooks=()):
    record = write_run_record(compose_cfg(*overrides), run_dir, [], run_dir)
    return Trainer(OmegaConf.load(record), run_dir, hooks=hooks)


@pytest.mark.parametrize(("action", "outcome"), [(Action.STOP, Aborted), (Action.PRUNE, Pruned)])
def test_a_hook_ends_the_run_with_a_typed_outcome(action, outcome, compose_cfg, tmp_path, one_thread):
    hook = StopAt(4, action)
    trainer = _trainer(compose_cfg, tmp_path, hooks=[hook])
    with pytest.raises(outcome, match="step 4: told to"):
        trainer.train()
    assert trainer.step == 4
    assert hook.seen == [(1, False), (2, False), (3, True), (4, False)], "hooks see every step, val/loss on eval steps"


def test_a_rollback_restores_the_newest_checkpoint(compose_cfg, tmp_path, one_thread):
    trainer = _trainer(compose_cfg, tmp_path, "trainer.checkpoint_every=2", hooks=[StopAt(5, Action.ROLLBACK)])
    trainer.train()
    (rollback,) = _events(tmp_path, "rollback")
    assert (rollback["from_step"], rollback["step"]) == (5, 4)
    assert trainer.step == 6


def test_a_rollback_without_a_checkpoint_aborts(compose_cfg, tmp_path, one_thread):
    trainer = _trainer(compose_cfg, tmp_path, hooks=[StopAt(1, Action.ROLLBACK)])
    with pytest.raises(Aborted, match="no complete checkpoint to roll back to"):
        trainer.train()


def test_loggers_close_when_the_run_fails(compose_cfg, tmp_path, one_thread):
    cfg = compose_cfg("build.allow=[tests.faulty.CrashingLogger]", "+logger.crash={_target_:tests.faulty.CrashingLogger,fail_at:2}")
    trainer = Trainer(OmegaConf.load(write_run_record(cfg, tmp_path, [], tmp_path)), tmp_path)
    with pytest.raises(RuntimeError, match="exploded"):
        trainer.train()
    assert (str(tmp_path), "failed") in CrashingLogger.closed


@pytest.mark.slow
def test_each_rank_checkpoints_its_own_rng_and_a_missing_one_is_left_alone(compose_cfg, tmp_path, one_thread):
    trainer = _trainer(compose_cfg, tmp_path, "trainer.max_steps=2", "optimizer.schedule.warmup_steps=1")
    trainer.train()
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(tmp_path / "checkpoints" / "step_2")).read_metadata().state_dict_metadata
    assert "train.rng.rank_0" in saved
    other = _trainer(compose_cfg, tmp_path / "other", "trainer.max_steps=2", "optimizer.schedule.warmup_steps=1")
    other.train_state.rank = 1  # as rank 1 of a larger job resuming a one-process checkpoint
    before = torch.get_rng_state()
    other.checkpointer.load(tmp_path / "checkpoints" / "step_2", other.train_state)
    assert other.step == 2 and torch.equal(torch.get_rng_state(), before)
