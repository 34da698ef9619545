"""Stage resume: N steps in one go against N/2 steps, a checkpoint, a resume in a new Trainer and N/2 more, on one
process, with the trainer's own checkpoints. On one process a resumed run must be the uninterrupted one, bit for bit:
same weights, buffers and per-step losses. What differs names what the checkpoint missed: state a model keeps outside
its state_dict (a plain attribute, a non-persistent buffer that training changes), randomness outside torch's RNG, or
data that depends on more than the step. (pytorch/torchtitan #809, NVIDIA-NeMo/Megatron-Bridge #3832 are such failures
in frameworks; bayesiains/nflows #4 in a model.)"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from currytrain.check.budget import FORWARD_SHARE
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status, fmt
from currytrain.check.subruns import derive, shared_data, write_record
from currytrain.components import Components, build_components
from currytrain.errors import Aborted
from currytrain.parallel.state import ParallelState
from currytrain.trainer.hooks import CONTINUE, Action, Decision

BuildParts = Callable[[DictConfig, ParallelState], Components]
"""(config, parallel state) -> the Components a run of that config trains (tests build a broken model here)."""


class StopAt:
    """A step hook that stops the run after step `step` (its checkpoint is written first)."""

    def __init__(self, step: int):
        self.step = step

    def after_step(self, step: int, metrics: Mapping[str, float]) -> Decision:
        return Decision(Action.STOP, f"the resume probe stops at step {step}") if step >= self.step else CONTINUE


def run_steps(ctx: StageContext, cfg: DictConfig, path: Path, build: BuildParts, stop_at: int | None = None) -> Any:
    """Train `cfg` in `path` (stopping after `stop_at` steps when given) and return the trainer."""
    from currytrain.trainer.trainer import Trainer

    trainer = Trainer(cfg, path, ctx.state, components=build(cfg, ctx.state), hooks=[StopAt(stop_at)] if stop_at else [])
    try:
        trainer.train()
    except Aborted:
        if stop_at is None:
            raise
    return trainer


def step_losses(path: Path) -> dict[int, float]:
    """The train loss of every journaled step of the run in `path` (its current attempt, after any resume)."""
    from currytrain.journal import read_journal

    records = read_journal(path / "journal.jsonl") if (path / "journal.jsonl").is_file() else []
    return {int(r["step"]): float(r["train/loss"]) for r in records if r.get("type") == "metrics" and "train/loss" in r}


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, non-persistent buffers included (they are named so: a checkpoint does not hold them)."""
    persistent = set(model.state_dict())
    state = {name: p.detach() for name, p in model.named_parameters()}
    state.update({name if name in persistent else f"{name} (not in the checkpoint)": b.detach() for name, b in model.named_buffers()})
    return state


def resume_finding(straight: Any, resumed: Any, losses: tuple[dict[int, float], dict[int, float]], steps: int) -> Finding:
    """The uninterrupted and the resumed run compared: weights and buffers bit for bit, and the losses of every step."""
    name = "resume equivalence"
    expected = f"{steps} steps in one go == {steps // 2} + checkpoint + resume + {steps - steps // 2}: identical weights, buffers and step losses"
    one, two = state_of(straight.module), state_of(resumed.module)
    differ = sorted(key for key in one.keys() | two.keys() if key not in one or key not in two or not torch.equal(one[key], two[key]))
    first = next((step for step in sorted(losses[0]) if losses[0][step] != losses[1].get(step)), None)
    if not differ and first is None:
        return Finding(name, Status.PASSED, f"identical weights, buffers and losses of all {steps} steps", expected)
    gaps = [float((one[key].float() - two[key].float()).abs().max()) for key in differ if key in one and key in two and one[key].shape == two[key].shape]
    observed = f"{len(differ)} of {len(one)} tensors differ ({', '.join(differ[:4])}{' ...' if len(differ) > 4 else ''})"
    if gaps:
        observed += f", by up to {fmt(max(gaps))}"
    if first is not None:
        observed += f"; the losses part at step {first} ({fmt(losses[0][first])} in one go, {fmt(losses[1].get(first, math.nan))} resumed)"
    return Finding(
        name,
        Status.FAILED,
        observed,
        expected,
        "the resumed run is not the uninterrupted one: the checkpoint misses state that training changes (a plain attribute or a "
        "non-persistent buffer: a data-dependent init flag that re-runs after loading), or the run draws randomness outside "
        "torch's RNG, or the data depends on more than the step",
        "keep training state in the state_dict (register_buffer, persistent), draw random numbers from torch, and derive "
        "every batch from (seed, split, step, micro, rank)",
    )


class Resume(Stage):
    """Resume equivalence on one process. Thresholds: ResumeConfig's fields."""

    name = "resume"
    needs_components = False

    def __init__(self, steps: int = 4):
        self.steps = max(2, steps)
        self.build: BuildParts | None = None
        """How each run builds its parts (None: as a run of the config does, on the ladder's shared data)."""

    def cost(self, ctx: StageContext, costs) -> float:
        """Three Trainers built, twice the steps, two one-batch evaluations."""
        return 3 * costs.build + costs.steps(2 * self.steps + 2 * FORWARD_SHARE)

    def assess(self, parts: Components | None, ctx: StageContext) -> StageResult:
        result = StageResult(self.name)
        if ctx.state.world_size > 1:
            finding = Finding("resume equivalence", Status.SKIPPED, f"{ctx.state.world_size} processes", "one process (bitwise)")
            result.findings.append(finding)
            return result
        half = self.steps // 2
        budget = [f"trainer.max_steps={self.steps}", f"trainer.checkpoint_every={half}", f"trainer.eval_every={self.steps}"]
        budget += ["trainer.eval_batches=1", "trainer.log_every=1", "trainer.compile=false"]
        cfg = derive(ctx.cfg, budget)
        build = self.build or (lambda config, state: build_components(config, state, shared_data(ctx, config)))
        root = Path(ctx.run_dir) / self.name
        paths = {"straight": root / "straight", "resumed": root / "resumed"}
        for path in paths.values():
            write_record(cfg, path, budget, ctx.state.is_main)
        try:
            straight = run_steps(ctx, cfg, paths["straight"], build)
            run_steps(ctx, cfg, paths["resumed"], build, stop_at=half)
            resumed = run_steps(ctx, derive(ctx.cfg, [*budget, "trainer.resume=auto"]), paths["resumed"], build)
            losses = (step_losses(paths["straight"]), step_losses(paths["resumed"]))
            result.findings.append(resume_finding(straight, resumed, losses, self.steps))
        finally:
            for path in paths.values():
                shutil.rmtree(path / "checkpoints", ignore_errors=True)
        return result
