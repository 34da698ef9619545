"""Data parallelism for real: gloo, 2 worker processes, a tiny model. Every strategy's loss curve equals the
single-process curve at the same global batch; checkpoints resume across layouts (DCP reshards)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, TINY, launch
from currytrain.journal import read_journal
from currytrain.trainer.trainer import Trainer
from currytrain.weights import RESOLVED

STEPS = 12
CURVE = [
    f"trainer.max_steps={STEPS}",
    "trainer.checkpoint_every=6",
    "trainer.keep_last=4",
    "trainer.eval_every=100",
    "logger=[jsonl]",
    "optimizer.schedule.warmup_steps=2",
]
STRATEGIES = {
    "ddp": ["parallel=ddp"],
    "zero1": ["parallel=zero1"],
    "zero2": ["parallel=zero2"],
    "fsdp": ["parallel=fsdp"],
    "hsdp": ["parallel=hsdp", "parallel.nproc=2", "parallel.dp_replicate=2"],  # 2 x 1
    "fabric": ["parallel=ddp", "parallel.runtime=fabric"],  # Lightning Fabric wraps DDP and runs the backward
}
RTOL = 1e-5
COMPILE_RTOL = 1e-4  # inductor's fused kernels sum in another order
BF16_RTOL = 2e-3  # bf16 rounds differently when FSDP gathers bf16 parameters than when autocast casts fp32 ones


def curve(run_dir: Path) -> dict[int, float]:
    return {event["step"]: event["train/loss"] for event in read_journal(run_dir / "journal.jsonl") if event["type"] == "metrics"}


def assert_same_curve(got: dict[int, float], want: dict[int, float], what: str) -> None:
    assert got, f"{what}: no metrics in the journal"
    for step, loss in got.items():
        assert math.isclose(loss, want[step], rel_tol=RTOL), f"{what}: step {step} loss {loss} != single-process {want[step]}"


def write_resolved(cfg, run_dir: Path) -> str:
    run_dir.mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / RESOLVED, resolve=True)
    return str(run_dir / RESOLVED)


def run_two_workers(paths: list[str], entry=None) -> None:
    """`entry(paths)` (default: tests/dp_worker.train_each) on 2 local workers."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from tests.dp_worker import train_each

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, run_id="test-dp")
    elastic_launch(config, entry or train_each)(paths)


def single(compose_cfg, run_dir: Path, *overrides: str) -> dict[int, float]:
    cfg = compose_cfg(*CURVE, *overrides)
    write_resolved(cfg, run_dir)
    Trainer(OmegaConf.load(run_dir / RESOLVED), run_dir).train()
    return curve(run_dir)


@pytest.mark.slow
def test_every_strategy_matches_single_process_and_resumes_across_layouts(compose_cfg, tmp_path, one_thread):
    reference = single(compose_cfg, tmp_path / "single")
    assert len(reference) == STEPS

    paths = [write_resolved(compose_cfg(*CURVE, *overrides), tmp_path / name) for name, overrides in STRATEGIES.items()]
    # Resumes onto 2 workers from the 6-step checkpoints of runs saved in other layouts (single@1, ddp@2).
    resumes = {"fsdp_from_single": ("fsdp", "single"), "fsdp_from_ddp": ("fsdp", "ddp"), "zero1_from_single": ("zero1", "single")}
    for name, (strategy, source) in resumes.items():
        checkpoint = tmp_path / source / "checkpoints" / "step_6"
        paths.append(write_resolved(compose_cfg(*CURVE, f"parallel={strategy}", f"trainer.resume={checkpoint}"), tmp_path / name))
    paths.append(write_resolved(compose_cfg(*CURVE, "parallel=fsdp", "trainer.precision=bf16"), tmp_path / "fsdp_bf16"))
    # trainer.compile under parallelism compiles each block (before fully_shard) and the loss, not one whole graph.
    paths.append(
        write_resolved(compose_cfg(*CURVE, "parallel=fsdp", "trainer.compile=true", f"trainer.compile_cache={tmp_path / 'cache'}"), tmp_path / "fsdp_compile")
    )
    run_two_workers(paths)

    for name in STRATEGIES:
        assert_same_curve(curve(tmp_path / name), reference, name)
    for name in resumes:
        resumed = curve(tmp_path / name)
        assert sorted(resumed) == list(range(7, STEPS + 1)), f"{name} did not continue from step 6"
        assert_same_curve(resumed, reference, name)
    # bf16: FSDP gathers bf16 parameters (MixedPrecisionPolicy) where one process autocasts fp32 ones.
    bf16 = curve(tmp_path / "fsdp_bf16")
    for step, loss in single(compose_cfg, tmp_path / "single_bf16", "trainer.precision=bf16").items():
        assert math.isclose(bf16[step], loss, rel_tol=BF16_RTOL), f"fsdp bf16: step {step} loss {bf16[step]} != single-process bf16 {loss}"
    compiled = curve(tmp_path / "fsdp_compile")
    assert all(math.isclose(compiled[step], loss, rel_tol=COMPILE_RTOL) for step, loss in reference.items()), (compiled, reference)
    report = next(event for event in read_journal(tmp_path / "fsdp_compile" / "journal.jsonl") if event["type"] == "compile")
    assert report["graphs"] == 2, report  # one for both blocks (they share their code), one for the loss
    # ... and back onto one process from sharded (fsdp@2, zero1@2) and Fabric-written checkpoints.
    for source in ("fsdp", "zero1", "fabric"):
        resumed = single(compose_cfg, tmp_path / f"single_from_{source}", f"trainer.resume={tmp_path / source / 'checkpoints' / 'step_6'}")
        assert sorted(resumed) == list(range(7, STEPS + 1)), f"single_from_{source} did not continue from step 6"
        assert_same_curve(resumed, reference, f"single_from_{source}")


@pytest.mark.slow
def test_exports_and_init_from_read_a_sharded_checkpoint(tmp_path):
    """An fsdp@2 checkpoint (each rank wrote its shards) exports to transformers with the trained weights, and
    a new run starts from it (trainer.init_from); DCP reassembles the shards for one process."""
    import torch
    import transformers

    from currytrain.hf.convert import export_hf, load_model

    result = launch("parallel=fsdp", "parallel.nproc=2", "logger=[jsonl]", "trainer.checkpoint_every=6", f"hydra.run.dir={tmp_path / 'fsdp'}")
    assert result.returncode == 0, result.stderr[-2000:]
    checkpoint = tmp_path / "fsdp" / "checkpoints" / "step_6"
    export_hf(checkpoint, tmp_path / "exported")
    ours = load_model(checkpoint)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens), atol=1e-5, rtol=0)
    result = launch("trainer.max_steps=3", "logger=[jsonl]", f"trainer.init_from={checkpoint}", f"hydra.run.dir={tmp_path / 'init'}")
    assert result.returncode == 0, result.stderr[-2000:]
    # It starts where the sharded run was at step 6, well below where that run started.
    assert curve(tmp_path / "init")[1] < curve(tmp_path / "fsdp")[1] - 0.1


# ------------------------------------------------------------------------------ launching, as a user does


def workers_of(run_dir: Path) -> dict[int, int]:
    """rank -> pid, from the line each worker prints first into its own stdout file."""
    pids = {}
    for path in (run_dir / "workers").glob("rank_*.stdout"):
        for line in path.read_text().splitlines():
            if line.startswith("curryTrain worker rank"):
                words = line.split()
                pids[int(words[3])] = int(words[5])
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


@pytest.mark.slow
def test_nproc_2_fsdp_one_run_folder_and_per_rank_logs(tmp_path):
    run_dir = tmp_path / "run"
    result = launch("model=gqa", "parallel=fsdp", "parallel.nproc=2", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    journal = read_journal(run_dir / "journal.jsonl")
    assert journal[0]["type"] == "header" and journal[0]["world_size"] == 2
    assert [event["type"] for event in journal].count("finish") == 1, "one journal, written by rank 0 alone"
    assert set(workers_of(run_dir)) == {0, 1}
    for rank in (0, 1):
        assert (run_dir / "workers" / f"rank_{rank}.stderr").exists()
    assert "final val loss" in result.stdout  # rank 0's output reaches the console


@pytest.mark.slow
def test_torchrun_ranks_share_rank_0s_run_folder(tmp_path):
    """No hydra.run.dir: Hydra's ${now:} default would differ per process; only rank 0 composes."""
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(ROOT / "launch.py"), "parallel=ddp", *TINY]
    result = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    run_dirs = [path for path in (tmp_path / "runs").glob("*/*") if path.is_dir()]
    assert len(run_dirs) == 1, run_dirs
    journal = read_journal(run_dirs[0] / "journal.jsonl")
    assert journal[0]["world_size"] == 2 and journal[-1]["type"] == "finish"


@pytest.mark.slow
def test_killed_worker_ends_the_run_then_resume_finishes_it(tmp_path):
    run_dir = tmp_path / "run"
    slow = ["build.allow=[tests.faulty.SlowLogger]", "+logger.slow={_target_:tests.faulty.SlowLogger,seconds:0.3}"]  # >= 4 s to kill it in
    overrides = ["parallel=ddp", "trainer.max_steps=20", "trainer.checkpoint_every=4", "trainer.eval_every=1000", *slow, f"hydra.run.dir={run_dir}"]
    args = [sys.executable, str(ROOT / "launch.py"), *TINY, *overrides]
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(e["type"] == "checkpoint" for e in _events(run_dir)) or len(workers_of(run_dir)) < 2:
        assert process.poll() is None and time.monotonic() < deadline, f"the run ended or stalled before its first checkpoint: {_events(run_dir)[-1:]}"
        time.sleep(0.2)
    pids = workers_of(run_dir)
    killed_at = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)
    returncode = process.wait(timeout=60)
    assert time.monotonic() - killed_at < 60
    assert returncode == 1, process.stderr.read()[-2000:]
    failed = [e for e in _events(run_dir) if e["type"] == "worker_failed"]
    assert failed and failed[0]["rank"] == 1 and "SIGKILL" in failed[0]["how"], failed
    time.sleep(1)
    assert not any(alive(pid) for pid in pids.values()), "a worker outlived the run"

    resumed = launch(*overrides, "trainer.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = _events(run_dir)
    assert any(e["type"] == "resume" for e in events) and events[-1]["type"] == "finish" and events[-1]["step"] == 20


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "journal.jsonl"
    return read_journal(path) if path.exists() else []


@pytest.mark.slow
def test_config_error_inside_a_worker_exits_2(tmp_path):
    run_dir = tmp_path / "run"
    result = launch(
        "parallel=ddp", "build.allow=[tests.faulty.RejectingLogger]", "+logger.reject={_target_:tests.faulty.RejectingLogger}", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "this logger refuses every run" in result.stderr
    kinds = {e["type"]: e for e in _events(run_dir)}
    assert "config_error" in kinds and kinds["worker_failed"]["rank"] == 0


@pytest.mark.slow
def test_submitit_local_runs_one_task_per_rank(tmp_path):
    """The SLURM path on this machine: 2 submitit tasks join one process group, rank 0 writes the record."""
    sweep_dir = tmp_path / "multirun"
    result = launch("-m", "hydra/launcher=slurm_local", "parallel=ddp", f"hydra.sweep.dir={sweep_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    journal = read_journal(sweep_dir / "0" / "journal.jsonl")
    assert journal[0]["type"] == "header" and journal[-1]["type"] == "finish"
    memory = next(event for event in journal if event["type"] == "memory")
    assert len(memory["ranks"]) == 2, "both tasks trained in one job"
    assert len(list((sweep_dir / ".submitit").glob("*/*_1_log.out"))) == 1, "submitit ran a second task"
