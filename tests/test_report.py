"""`currytrain journal`, `compare` and `diagnose` on real runs: five provoked failures each named with
its fix, and comparisons whose verdicts account for seed noise."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, TINY, launch
from currytrain.report.compare import compare, seeds_needed
from currytrain.report.diagnose import diagnose
from currytrain.run import write_run_record
from currytrain.trainer.hooks import Decision
from currytrain.trainer.trainer import Trainer


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "currytrain.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _causes(run_dir) -> list[str]:
    return [finding.cause for finding in diagnose(run_dir)]


def test_huge_lr_is_diagnosed_as_nan_with_the_step_and_the_lr(tmp_path):
    launch("optimizer.lr=1e6", "abort=none", "trainer.max_steps=8", f"hydra.run.dir={tmp_path}")
    (finding, *_) = diagnose(tmp_path)
    assert finding.cause == "nan" and finding.step is not None and finding.step <= 8
    assert "optimizer.lr=1000000.0" in finding.summary and "lower optimizer.lr" in finding.fix


def test_a_memory_cap_is_diagnosed_as_oom_with_where_and_how_much(tmp_path):
    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))

    args = [sys.executable, str(ROOT / "launch.py"), *TINY, "model.mlp_hidden=4000000", f"hydra.run.dir={tmp_path}"]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=cap_memory)
    assert result.returncode == 1, result.stderr[-2000:]
    (finding,) = diagnose(tmp_path)
    assert finding.cause == "oom" and "bytes" in finding.summary and "model.ac=full" in finding.fix


class Stall:
    def after_step(self, step, metrics):
        if step == 8:
            time.sleep(2.5)
        return Decision()


def test_a_stalled_step_is_diagnosed_with_where_it_happened(compose_cfg, tmp_path, one_thread):
    cfg = OmegaConf.load(write_run_record(compose_cfg("trainer.max_steps=12"), tmp_path, [], tmp_path))
    Trainer(cfg, tmp_path, hooks=[Stall()]).train()
    stall = [f for f in diagnose(tmp_path) if f.cause == "stall"]
    assert stall and stall[0].step == 8 and "stalled for 2." in stall[0].summary


def test_a_rising_val_loss_is_diagnosed_as_divergence(tmp_path):
    overrides = ["trainer.max_steps=40", "trainer.eval_every=5", "optimizer.lr=3.0", "optimizer.schedule.warmup_steps=39", "abort=none"]
    result = launch(*overrides, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert _causes(tmp_path)[0] == "divergence"


def test_a_killed_run_is_diagnosed_and_the_cli_prints_json(tmp_path):
    args = [sys.executable, str(ROOT / "launch.py"), *TINY, "trainer.max_steps=100000", "trainer.log_every=1", f"hydra.run.dir={tmp_path}"]
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = tmp_path / "journal.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (journal.is_file() and '"metrics"' in journal.read_text()):
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    result = cli("diagnose", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    (finding,) = json.loads(result.stdout)
    assert finding["cause"] == "killed" and "trainer.resume=auto" in finding["fix"]


def test_journal_prints_a_timeline_and_a_healthy_run_is_ok(tmp_path):
    launch(f"hydra.run.dir={tmp_path}")
    assert _causes(tmp_path) == ["ok"]
    lines = cli("journal", str(tmp_path)).stdout.splitlines()
    assert lines[0].split()[1] == "header" and "finish" in lines[-1] and any("metrics   steps 1-3 (3 records)" in line for line in lines)


def _seed_runs(compose_cfg, folder, seeds, *overrides):
    for seed in seeds:
        run_dir = folder / f"seed{seed}"
        cfg = OmegaConf.load(write_run_record(compose_cfg(f"seed={seed}", "trainer.max_steps=20", "trainer.eval_every=10", *overrides), run_dir, [], run_dir))
        Trainer(cfg, run_dir).train()


def test_compare_finds_a_real_difference_and_calls_seed_noise_noise(compose_cfg, tmp_path, one_thread):
    _seed_runs(compose_cfg, tmp_path / "sweep", range(3), "optimizer.lr=0.003")
    _seed_runs(compose_cfg, tmp_path / "sweep", range(3, 6), "optimizer.lr=0.0003")  # 10x off
    groups, found, report = compare([str(tmp_path / "sweep")], tmp_path / "out")
    assert [len(g.runs) for g in groups] == [3, 3] and groups[1].name == "optimizer.lr=0.0003"
    assert found[0].text.startswith("optimizer.lr=0.0003 is worse than baseline by")
    assert (tmp_path / "out" / "curves.png").stat().st_size > 0 and "## Verdicts" in report.read_text()

    _seed_runs(compose_cfg, tmp_path / "a", range(3))
    _seed_runs(compose_cfg, tmp_path / "b", range(3, 6))
    _, found, _ = compare([str(tmp_path / "a"), str(tmp_path / "b")], tmp_path / "out2")
    assert found[0].text.startswith("within seed noise"), found[0].text


def test_compare_refuses_a_verdict_from_single_seeds(compose_cfg, tmp_path, one_thread):
    _seed_runs(compose_cfg, tmp_path / "a", [0])
    _seed_runs(compose_cfg, tmp_path / "b", [1])
    result = cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "no verdict from single seeds" in result.stdout and "run at least 3 seeds" in result.stdout


def test_seeds_needed_follows_the_power_rule():
    assert seeds_needed(noise=0.1, effect=0.1) == 16  # 2 * (1.96 + 0.84)^2 = 15.7
    assert seeds_needed(noise=0.01, effect=0.1) == 2


@pytest.mark.parametrize("args", [["diagnose", "/no/such/run"], ["compare", "/no/such/runs"], ["journal", "/no/such/run"]])
def test_missing_folders_are_config_errors(args):
    result = cli(*args)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "/no/such" in result.stderr


def test_bench_refuses_a_layout_of_several_processes_instead_of_timing_one():
    result = cli("bench", *TINY, "parallel=ddp", "--steps", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "parallel.nproc=2 asks for 2: pass parallel=single" in result.stderr


def test_bench_prints_a_json_record_of_the_step(tmp_path):
    result = cli("bench", *TINY, "--steps", "2", "--warmup", "1", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(result.stdout)
    assert record["tokens_per_step"] == 4 * 32 and record["step_seconds"]["min"] <= record["step_seconds"]["median"] <= record["step_seconds"]["max"]
    assert 0 < record["mfu"] and record["roofline_flops_per_s"] > 0 and set(record["split_seconds"]) == {"forward", "backward", "optimizer"}
    assert record["model_flops_per_token"] == 6 * (25_696 - 256 * 32) + 12 * 1 * 32 * 32  # 6 N (no embedding) + 12 L d s
