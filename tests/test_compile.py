"""The fast paths: a step that never waits for the device between log steps, and trainer.compile (forward and
loss as one graph on one process, the persistent compile cache)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from conftest import launch, launch_subprocess, train_losses
from currytrain.journal import read_journal
from currytrain.parallel.compile import record_compile_seconds, recorded_compile_seconds
from currytrain.trainer import step
from currytrain.trainer.hooks import CONTINUE, Decision
from currytrain.trainer.step import accumulated_step
from currytrain.trainer.trainer import Trainer

FAST_DATA = "data.max_bytes=300000"
READ_BACKS = ("item", "tolist", "__bool__", "__float__", "__int__")


@pytest.fixture
def no_read_back(monkeypatch):
    """Every way Python code reads a tensor's value back to the host raises (on CUDA each would wait for it)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the step read a value back from the device")

    for name in READ_BACKS:
        monkeypatch.setattr(torch.Tensor, name, refuse)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64))


def test_a_non_finite_step_is_skipped_on_the_device_without_a_read_back(no_read_back, monkeypatch):
    """An accelerator's path (found_inf in the fused kernel), run on the CPU's kernels: on the CPU itself the
    step reads the norm once, which waits for nothing there (tests/test_step.py runs both)."""
    monkeypatch.setattr(step, "read_without_waiting", lambda tensor: False)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    before = [p.detach().clone() for p in model.parameters()]
    batch = (torch.randint(64, (4, 16)), torch.randint(64, (4, 16)))
    bad = accumulated_step(model, optimizer, [batch], grad_clip=1.0, loss_fn=lambda logits, targets: logits.sum() * float("nan"))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(torch.equal(optimizer.state[p]["step"], torch.zeros(())) for p in model.parameters())  # Adam's bias correction unmoved
    good = accumulated_step(model, optimizer, [batch], grad_clip=1.0)
    assert all(torch.equal(optimizer.state[p]["step"], torch.ones(())) for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not hasattr(optimizer, "found_inf")  # no leftover for a later, unguarded step
    assert bad.skipped.numpy() == 1.0 and good.skipped.numpy() == 0.0  # numpy reads it: the patched methods are torch's


class Recorder:
    def __init__(self):
        self.seen: list[tuple[int, float, float]] = []

    def after_step(self, step: int, metrics: Mapping[str, float]) -> Decision:
        self.seen.append((step, metrics["train/loss"], metrics["train/grad_norm"]))
        return CONTINUE


@pytest.mark.slow
def test_fetching_only_at_log_steps_shows_every_step_to_the_hooks(compose_cfg, tmp_path):
    """log_every=3 reads steps 2-3 and 4-6 back together; the hooks still see each step, with the same values
    as a run that reads every step back."""
    seen = {}
    for log_every in (1, 3):
        recorder = Recorder()
        cfg = compose_cfg(FAST_DATA, f"trainer.log_every={log_every}", "trainer.eval_every=100", "logger=[jsonl]")
        Trainer(cfg, tmp_path / str(log_every), hooks=[recorder]).train()
        seen[log_every] = recorder.seen
    assert [step for step, *_ in seen[3]] == [1, 2, 3, 4, 5, 6]
    assert seen[3] == seen[1]
    logged = [event["step"] for event in read_journal(tmp_path / "3" / "journal.jsonl") if event["type"] == "metrics"]
    assert logged == [3, 6]


def test_compile_needs_a_cxx_compiler(tmp_path):
    result = launch("trainer.compile=true", f"hydra.run.dir={tmp_path / 'run'}", env={"CXX": str(tmp_path / "no-such-g++")})
    assert result.returncode == 2, result.stderr
    assert "trainer.compile=true needs a C++ compiler" in result.stderr + result.stdout
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def compiled_runs(tmp_path_factory):
    """An eager run, then the same run compiled twice in fresh processes, in run folders of different parents (two
    days' runs of a project) sharing one trainer.compile_cache."""
    root = tmp_path_factory.mktemp("compile")
    runs = {}
    for name, compile in (("eager", "false"), ("cold", "true"), ("warm", "true")):
        run = launch if compile == "false" else launch_subprocess  # compiled runs start fresh processes: that is what the cache is for
        result = run(
            FAST_DATA,
            "model.n_layers=2",
            "trainer.max_steps=4",
            "trainer.eval_every=100",
            f"trainer.compile={compile}",
            f"trainer.compile_cache={root / 'cache'}",
            f"hydra.run.dir={root / name / 'run'}",
            timeout=600,
        )
        assert result.returncode == 0, result.stderr
        runs[name] = root / name / "run"
    return runs


@pytest.mark.slow  # compiling even the TINY model takes ~30 s on 2 quiet cores (minutes under load)
def test_compiled_training_matches_eager_and_a_second_run_reuses_the_cache(compiled_runs):
    eager, cold = train_losses(compiled_runs["eager"]), train_losses(compiled_runs["cold"])
    assert len(eager) == len(cold) == 4
    assert all(abs(a - b) < 1e-4 for a, b in zip(eager, cold)), (eager, cold)
    reports = {name: next(e for e in read_journal(compiled_runs[name] / "journal.jsonl") if e["type"] == "compile") for name in ("cold", "warm")}
    cache = compiled_runs["cold"].parents[1] / "cache"
    assert reports["cold"]["cache_dir"] == str(cache) and any(cache.iterdir())
    # inductor's CPU vector-ISA checks ran before the step (detect_vec_isa), in the machine's cache, not the project's.
    assert reports["cold"]["isa_seconds"] > 0 and reports["warm"]["isa_seconds"] > 0, reports
    assert not [path for path in cache.rglob("*.cpp") if "_chk_kernel" in path.read_text()]
    # One process: the forward and the loss compiled as one graph (with parallelism, tests/test_parallel.py: per block).
    assert reports["cold"]["graphs"] == 1 and reports["cold"]["cache_misses"] > 0
    # The second run, a fresh process in another folder, loads every graph from the shared cache.
    assert reports["warm"]["cache_hits"] > 0 and reports["warm"]["cache_misses"] == 0, reports
    # The same kernels; a reduction's split may still follow the threads the process got (seen: 5e-7 under load).
    assert all(abs(a - b) < 1e-5 for a, b in zip(train_losses(compiled_runs["warm"]), cold, strict=True))


def _events(run_dir: Path, kind: str) -> list[dict]:
    return [event for event in read_journal(run_dir / "journal.jsonl") if event["type"] == kind]


def test_compile_auto_stays_eager_where_the_run_cannot_repay_it(compose_cfg, tmp_path, monkeypatch):
    """TINY steps take milliseconds: two timed eager steps times the remaining ones cannot repay the assumed compile
    cost, so auto stays eager, and says so, with its figures, in the journal. The cost it looks up lives in the
    project's cache folder: trainer.compile_cache's default, relative to where the run was started."""
    monkeypatch.chdir(tmp_path)  # the project's directory
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cfg = compose_cfg(FAST_DATA, "trainer.max_steps=8", "trainer.eval_every=100", "trainer.compile=auto", "logger=[jsonl]")
    Trainer(cfg, tmp_path / "runs" / "day1" / "run").train()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str((tmp_path / ".cache" / "compile").resolve())
    (choice,) = _events(tmp_path / "runs" / "day1" / "run", "compile_choice")
    assert choice["choice"] == "eager" and choice["step"] == 3, choice
    assert choice["compile_seconds_source"] == "assumed" and choice["remaining_steps"] == 5
    assert choice["expected_saving_seconds"] < choice["compile_seconds"]
    assert "does not repay" in choice["reason"]
    assert not _events(tmp_path / "runs" / "day1" / "run", "compile")
    # Too short to time anything: eager at once.
    short = compose_cfg(FAST_DATA, "trainer.max_steps=3", "trainer.eval_every=100", "trainer.compile=auto", "logger=[jsonl]")
    Trainer(short, tmp_path / "short").train()
    (choice,) = _events(tmp_path / "short", "compile_choice")
    assert choice["choice"] == "eager" and choice["step"] == 0 and "too few" in choice["reason"]


def test_compile_auto_rejects_other_values(tmp_path):
    result = launch("trainer.compile=sometimes", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2
    assert "trainer.compile='sometimes' must be true, false or auto" in result.stderr + result.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # it compiles the TINY model (30-90 s on 2 shared cores)
def test_compile_auto_compiles_when_a_measured_cost_is_repaid_and_trains_as_eager(compose_cfg, tmp_path):
    """A compile cost recorded by an earlier compiled run of the same setup (here: a cheap one, written first) is
    repaid by the remaining steps: auto compiles from the step after its choice; the losses stay eager's."""
    overrides = (
        FAST_DATA,
        "model.n_layers=2",
        "trainer.max_steps=6",
        "trainer.eval_every=100",
        "logger=[jsonl]",
        f"trainer.compile_cache={tmp_path / 'cache'}",
    )
    Trainer(compose_cfg(*overrides, "trainer.compile=false"), tmp_path / "eager").train()
    trainer = Trainer(compose_cfg(*overrides, "trainer.compile=auto"), tmp_path / "auto")
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    assert cache == (tmp_path / "cache").resolve()
    record_compile_seconds(cache, trainer.compile_signature, 0.001)
    trainer.train()
    (choice,) = _events(tmp_path / "auto", "compile_choice")
    assert choice["choice"] == "compile" and choice["step"] == 3 and choice["compile_seconds_source"] == "measured", choice
    (report,) = _events(tmp_path / "auto", "compile")
    assert report["step"] == 4 and report["graphs"] >= 1
    # The compiled run records its own cost (with the ISA checks detect_vec_isa ran first) for the next auto run.
    assert recorded_compile_seconds(cache, trainer.compile_signature) == pytest.approx(report["first_step_seconds"] + report["isa_seconds"], abs=2e-3)
    eager, auto = train_losses(tmp_path / "eager"), train_losses(tmp_path / "auto")
    assert len(eager) == len(auto) == 6
    assert all(abs(a - b) < 1e-4 for a, b in zip(eager, auto)), (eager, auto)
