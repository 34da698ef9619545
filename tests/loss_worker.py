"""What the workers of tests/test_loss_math.py run: for each resolved config, one training step and one eval of the
real Trainer on tests/ragged.RaggedTokens (the step's sequences score very different numbers of targets on each
rank and microbatch), then every parameter this rank holds, whole (DTensors gathered), saved for the test."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.distributed.tensor import DTensor

from currytrain.components import build_components, parallel_session
from currytrain.trainer.trainer import Trainer
from currytrain.workers import worker_threads
from tests.ragged import RaggedTokens, ZeroMaskedSum, zero_prompts

SCORED = (1, 30, 2, 31, 3, 29, 1, 27)
"""Scored targets of each of a step's 8 sequences (of 32 positions): every split of them is ragged."""


def step_and_eval(cfg, run_dir: Path, state) -> dict:
    """One Trainer step and one eval on RaggedTokens: this rank's parameters after the step and their update (whole),
    the step's loss and the val loss."""
    data = RaggedTokens(cfg.data.seq_len, 256, scored=SCORED)
    if "counting its own targets" in run_dir.name:  # the data's own loss() ignores target 0, which it does not declare
        data = zero_prompts(ZeroMaskedSum(cfg.data.seq_len, 256, scored=SCORED))
    parts = build_components(cfg, state, data=data)
    trainer = Trainer(cfg, run_dir, state, components=parts)
    before = whole_parameters(parts.module)
    loss = trainer.train_step()["train/loss"]
    params = whole_parameters(parts.module)
    update = {name: params[name] - before[name] for name in params}
    return {"params": params, "update": update, "loss": loss, "val": trainer.evaluate()}


def whole_parameters(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for name, p in module.named_parameters()}


def run_each(resolved_paths: list[str]) -> None:
    torch.set_num_threads(worker_threads())  # 2 workers share the cores
    dist.init_process_group("gloo")
    try:
        for path in resolved_paths:
            cfg = OmegaConf.load(path)
            with parallel_session(cfg) as state:
                result = step_and_eval(cfg, Path(path).parent, state)
            torch.save(result, Path(path).parent / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()
