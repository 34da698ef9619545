"""End-to-end training: the run folder, determinism, exact resume, checkpoint retention."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import launch
from currytrain.journal import read_journal
from currytrain.run import RESOLVED, write_run_record
from currytrain.trainer.trainer import Trainer
from currytrain.weights import MARKER, find_checkpoint

FAST_DATA = "data.max_bytes=300000"


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}


@pytest.mark.slow
def test_launch_writes_a_complete_run_folder(tmp_path):
    run_dir = tmp_path / "run"
    result = launch(FAST_DATA, "trainer.max_steps=6", "trainer.checkpoint_every=2", "trainer.keep_last=2", "seed=7", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr
    assert "final val loss" in result.stdout

    resolved = OmegaConf.load(run_dir / RESOLVED)
    assert resolved.seed == 7 and resolved.data.seq_len == 32  # interpolations resolved

    journal = read_journal(run_dir / "journal.jsonl")
    header = journal[0]
    assert header["type"] == "header" and header["seed"] == 7 and header["world_size"] == 1
    assert header["versions"]["torch"] and header["host"]
    assert "git_sha" in header and "git_dirty" in header
    assert header["config_diff"]["seed"] == {"default": 0, "value": 7}
    assert header["config_diff"]["model.dim"] == {"default": 128, "value": 32}
    kinds = [event["type"] for event in journal]
    assert kinds[1] == "start" and kinds[-1] == "finish" and kinds.count("checkpoint") == 3 and "eval" in kinds
    curve = {e["step"]: e["train/loss"] for e in journal if e["type"] == "metrics"}
    assert curve == _losses(run_dir) and sorted(curve) == [1, 2, 3, 4, 5, 6]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    assert [s.step for s in events.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [s.step for s in events.Scalars("val/loss")] == [3, 6]  # every eval_every, the last one being the final eval

    # keep_last=2 of the saves at steps 2, 4, 6
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["step_4", "step_6"]
    assert all((run_dir / "checkpoints" / name / MARKER).is_file() for name in checkpoints)
    assert all((run_dir / "checkpoints" / name / ".metadata").is_file() for name in checkpoints)


@pytest.mark.slow
def test_same_seed_gives_the_same_loss_curve_and_another_seed_does_not(tmp_path):
    curves = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        result = launch(FAST_DATA, f"seed={seed}", "trainer.checkpoint_every=0", f"hydra.run.dir={tmp_path / name}")
        assert result.returncode == 0, result.stderr
        curves[name] = _losses(tmp_path / name)
    assert curves["a"] == curves["b"]
    assert curves["a"] != curves["c"]


def _record(compose_cfg, run_dir: Path, *overrides: str) -> Path:
    cfg = compose_cfg(FAST_DATA, "trainer.max_steps=8", "trainer.checkpoint_every=4", *overrides)
    return write_run_record(cfg, run_dir, list(overrides), cwd=Path.cwd())


@pytest.mark.slow
def test_a_run_stopped_and_resumed_has_exactly_the_uninterrupted_loss_curve(compose_cfg, tmp_path):
    full = Trainer(OmegaConf.load(_record(compose_cfg, tmp_path / "full")), tmp_path / "full")
    full.train()
    uninterrupted = _losses(tmp_path / "full")

    # The same run dies after step 6, two steps past its step-4 checkpoint ...
    crashed = Trainer(OmegaConf.load(_record(compose_cfg, tmp_path / "crash")), tmp_path / "crash")
    for _ in range(6):
        crashed.train_step()
    crashed.loggers.close()
    del crashed
    assert find_checkpoint(tmp_path / "crash").name == "step_4"

    # ... and is relaunched with resume=auto in the same folder.
    resumed_cfg = OmegaConf.load(_record(compose_cfg, tmp_path / "crash", "trainer.resume=auto"))
    resumed = Trainer(resumed_cfg, tmp_path / "crash")
    resumed.train()
    rows = [json.loads(line) for line in (tmp_path / "crash" / "metrics.jsonl").read_text().splitlines()]
    # The resume dropped the lines of steps 5 and 6 it re-ran: each step once, with the uninterrupted values.
    curve = [(row["step"], row["train/loss"]) for row in rows if "train/loss" in row]
    assert curve == sorted(uninterrupted.items())
    journal = read_journal(tmp_path / "crash" / "journal.jsonl")
    assert [e["type"] for e in journal].count("resume") == 1
    assert next(e for e in journal if e["type"] == "resume")["step"] == 4
    assert journal[0]["type"] == "header" and any(e["type"] == "launch" for e in journal)


@pytest.mark.slow
def test_incomplete_checkpoints_are_never_resumed_from(tmp_path):
    result = launch(FAST_DATA, "trainer.max_steps=4", "trainer.checkpoint_every=2", "trainer.keep_last=3", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    (tmp_path / "checkpoints" / "step_4" / MARKER).unlink()  # as if the save of step 4 was cut short
    assert find_checkpoint(tmp_path).name == "step_2"
    again = launch(FAST_DATA, "trainer.max_steps=4", "trainer.checkpoint_every=2", "trainer.keep_last=3", "trainer.resume=auto", f"hydra.run.dir={tmp_path}")
    assert again.returncode == 0, again.stderr
    resume = next(e for e in read_journal(tmp_path / "journal.jsonl") if e["type"] == "resume")
    assert resume["step"] == 2 and resume["path"].endswith("step_2")
    assert find_checkpoint(tmp_path).name == "step_4"  # re-saved, complete this time


@pytest.mark.slow
def test_the_default_run_learns_the_stdlib_corpus(tmp_path):
    """`make train` as shipped: the default config must end at <= 1.70 nats/byte (uniform is 5.55; 1.578 here)."""
    result = launch(f"hydra.run.dir={tmp_path}", tiny=False, timeout=900)
    assert result.returncode == 0, result.stderr
    finish = read_journal(tmp_path / "journal.jsonl")[-1]
    assert finish["type"] == "finish" and finish["step"] == 1200
    assert finish["val_loss"] <= 1.70, finish
    assert f"final val loss {finish['val_loss']:.4f}" in result.stdout
    assert find_checkpoint(tmp_path).name == "step_1200"
