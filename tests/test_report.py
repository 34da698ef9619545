"""`currytrain journal`, `compare` and `diagnose` on real runs: five provoked failures each named with
its fix, and comparisons whose verdicts account for seed noise."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, TINY, compose_tiny, launch, single_threaded
from currytrain.report.compare import compare
from currytrain.report.diagnose import diagnose
from currytrain.run import write_run_record
from currytrain.stats import seeds_needed
from currytrain.trainer.hooks import Decision
from currytrain.trainer.trainer import Trainer


def cli(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "currytrain.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _causes(run_dir) -> list[str]:
    return [finding.cause for finding in diagnose(run_dir)]


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_journal_prints_a_timeline_and_a_healthy_run_is_ok(tmp_path):
    launch(f"hydra.run.dir={tmp_path}")
    assert _causes(tmp_path) == ["ok"]
    lines = cli("journal", str(tmp_path)).stdout.splitlines()
    assert lines[0].split()[1] == "header" and "finish" in lines[-1] and any("metrics   steps 1-3 (3 records)" in line for line in lines)


def _train(run_dir, *overrides):
    cfg = OmegaConf.load(write_run_record(compose_tiny(*overrides, "trainer.max_steps=20", "trainer.eval_every=10"), run_dir, [], run_dir))
    Trainer(cfg, run_dir).train()


@pytest.fixture(scope="module")
def six_runs(tmp_path_factory):
    """The issue's six run folders, each a run of its own: lr 3e-3 (good) and 3e-5 (bad), seeds 0, 1, 2 each."""
    folder = tmp_path_factory.mktemp("six")
    with single_threaded():
        for name, lr in (("good", "0.003"), ("bad", "3e-05")):
            for seed in range(3):
                _train(folder / f"{name}{seed}", f"seed={seed}", f"optimizer.lr={lr}")
    return folder


def _six(folder) -> list[str]:
    return [str(folder / f"{name}{seed}") for name in ("good", "bad") for seed in range(3)]


@pytest.mark.slow
def test_six_run_folders_group_by_config_pair_by_seed_and_report_beside_the_runs(six_runs, tmp_path):
    result = cli("compare", *_six(six_runs), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "optimizer.lr=3e-05 is worse than optimizer.lr=0.003: +" in result.stdout, result.stdout
    assert "p = " in result.stdout and "paired t, 3 paired seeds, alpha 0.05" in result.stdout
    assert list(tmp_path.iterdir()) == [], "nothing written into the current directory"
    report = (six_runs / "compare" / "report.md").read_text()
    assert "## What differs" in report and "| optimizer.lr | 0.003 | 3e-05 |" in report and (six_runs / "compare" / "curves.png").stat().st_size > 0
    flipped = cli("compare", *_six(six_runs), "--baseline", "optimizer.lr=3e-05", "--alpha", "0.01", "--out", str(tmp_path / "out"))
    assert "optimizer.lr=0.003 is better than optimizer.lr=3e-05: -" in flipped.stdout and "alpha 0.01" in flipped.stdout, flipped.stdout
    wilcoxon = compare(_six(six_runs), tmp_path / "w", test="wilcoxon")
    assert wilcoxon.verdicts[0].word == "inconclusive" and wilcoxon.verdicts[0].p == 0.25, "3 pairs: the exact signed-rank p is at least 1/4"


@pytest.mark.slow
def test_unshared_seeds_of_a_near_identical_config_are_welch_and_inconclusive(six_runs, tmp_path, one_thread):
    for seed in range(3, 6):
        _train(tmp_path / f"near{seed}", f"seed={seed}", "optimizer.lr=0.00301")
    found = compare([*_six(six_runs)[:3], str(tmp_path)], tmp_path / "out")
    (verdict,) = found.verdicts
    assert verdict.comparison.test == "Welch t" and verdict.comparison.n == (3, 3)
    assert verdict.word == "inconclusive" and verdict.text.startswith("optimizer.lr=0.00301 vs optimizer.lr=0.003: inconclusive"), verdict.text


def test_compare_refuses_a_verdict_from_single_seeds(six_runs, tmp_path):
    result = cli("compare", str(six_runs / "good0"), str(six_runs / "bad1"), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "no verdict (optimizer.lr=0.003: 1, optimizer.lr=3e-05: 1 seeds)" in result.stdout and "run at least 3 seeds" in result.stdout


def _without_val_loss(run, copy):
    """A finished run whose journal never recorded val_loss: another metric's run."""
    shutil.copytree(run, copy)
    records = [json.loads(line) for line in (copy / "journal.jsonl").read_text().splitlines()]
    lines = [json.dumps({k: v for k, v in r.items() if k != "val_loss"}) for r in records if r["type"] != "eval"]
    (copy / "journal.jsonl").write_text("\n".join(lines) + "\n")
    return str(copy)


@pytest.mark.parametrize(
    "case, message",
    [
        ("not a run", "holds no run folder (no journal.jsonl below it): pass a run, multirun or sweep folder"),
        ("other metrics", "--metric val_loss: 1 of 4 finished runs never recorded it"),
        ("unknown metric", "--metric val/acc: 6 of 6 finished runs never recorded it"),
        ("no such baseline", "--baseline optimizer.lr=1 matches no group: pass one of ['optimizer.lr=0.003', 'optimizer.lr=3e-05']"),
        ("bad alpha", "--alpha 0.7: choose a level in (0, 0.5)"),
    ],
)
def test_bad_compare_input_exits_2_with_the_fix_and_writes_nothing(six_runs, tmp_path, case, message):
    args = {
        "not a run": lambda: [str(six_runs / "good0"), str(tmp_path)],
        "other metrics": lambda: [*_six(six_runs)[:3], _without_val_loss(six_runs / "bad0", tmp_path / "odd")],
        "unknown metric": lambda: [*_six(six_runs), "--metric", "val/acc"],
        "no such baseline": lambda: [*_six(six_runs), "--baseline", "optimizer.lr=1"],
        "bad alpha": lambda: [*_six(six_runs), "--alpha", "0.7"],
    }[case]()
    result = cli("compare", *args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr and message in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "out").exists()
    if case == "other metrics":
        assert "pass --metric one of [" in result.stderr and "'train/loss'" in result.stderr


def test_compare_reads_a_sweep_folder_and_a_multirun_folder_in_one_call(tmp_path):
    sweep, multirun = tmp_path / "sweep", tmp_path / "multirun"
    for args in (("-m", "sweep=random", "sweep.n_trials=2", f"hydra.sweep.dir={sweep}"), ("-m", "seed=0,1", f"hydra.sweep.dir={multirun}")):
        done = launch(*args)
        assert done.returncode == 0, done.stderr[-2000:]
    result = cli("compare", str(sweep), str(multirun), "--baseline", str(multirun / "0"))
    assert result.returncode == 0, result.stderr[-2000:]
    found = compare([str(sweep), str(multirun)], tmp_path / "again", baseline=str(multirun / "0"))
    assert sorted(len(g.runs) for g in found.groups) == [1, 1, 2] and found.baseline.runs[0].path.parent == multirun
    assert set(found.differs) == {"optimizer.lr"}, "the sweep's own settings do not split a trial from the same config run alone"
    assert all("no verdict" in line and "would detect" in line for line in found.lines), found.lines
    assert (tmp_path / "compare" / "report.md").is_file() and (sweep / "report.md").read_text().startswith("# Sweep report"), "the sweep's report is kept"
    assert (
        "vs runner-up (optimizer.lr=" in (sweep / "report.md").read_text()
        and "1 and 1 seed(s), so the gap cannot be told from seed noise" in (sweep / "report.md").read_text()
    )


def test_seeds_needed_follows_the_power_rule():
    assert seeds_needed(noise=0.1, effect=0.1) == 17  # exact t: 16 seeds have 78% power (the normal rule's 15.7 said 16)
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


def _study(values: dict[tuple[float, int], float]):
    """An in-memory Optuna study holding one complete trial per (lr, seed): value."""
    import optuna
    from optuna.distributions import FloatDistribution, IntDistribution

    study = optuna.create_study(direction="minimize")
    space = {"optimizer.lr": FloatDistribution(1e-5, 1.0, log=True), "seed": IntDistribution(0, 10)}
    for (lr, seed), value in values.items():
        study.add_trial(optuna.trial.create_trial(params={"optimizer.lr": lr, "seed": seed}, distributions=space, value=value))
    return study


def test_sweep_report_says_whether_the_best_config_is_distinguishable_from_the_runner_up():
    from currytrain.sweep.report import best_vs_runner_up

    single = best_vs_runner_up(_study({(0.01, 0): 2.90, (0.003, 0): 2.95, (0.001, 0): 3.4}), "val_loss")
    assert "Best (optimizer.lr=0.01) vs runner-up (optimizer.lr=0.003)" in single and "gap 0.0500, not distinguishable yet: 1 and 1 seed(s)" in single
    seeded = {(0.01, s): v for s, v in enumerate([2.90, 3.05, 2.95])} | {(0.003, s): v + 0.02 for s, v in enumerate([2.90, 3.05, 2.95])}
    paired = best_vs_runner_up(_study(seeded), "val_loss")
    assert "optimizer.lr=0.01 is better than optimizer.lr=0.003: -0.0200" in paired and "paired t, 3 paired seeds" in paired, paired
    noisy = {(0.01, s): v for s, v in enumerate([2.90, 3.05, 2.95])} | {(0.003, s): v for s, v in enumerate([2.96, 2.93, 3.05])}
    assert "optimizer.lr=0.01 vs optimizer.lr=0.003: inconclusive" in best_vs_runner_up(_study(noisy), "val_loss")


def test_a_run_that_ends_at_chance_is_diagnosed_as_such(compose_cfg, tmp_path, one_thread):
    """A run whose weights never move (lr 0: a fine-tune that trains nothing) ends at ln(vocab): named, not "ok"."""
    cfg = OmegaConf.load(write_run_record(compose_cfg("optimizer.lr=0", "data.max_bytes=300000"), tmp_path, [], tmp_path))
    Trainer(cfg, tmp_path).train()
    (finding,) = diagnose(tmp_path)
    assert finding.cause == "chance" and "ln(256) = 5.5452" in finding.summary and "check=sanity" in finding.fix, finding
