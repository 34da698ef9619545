"""The LR schedule: linear warmup to the peak, then cosine/linear decay to min_lr_ratio, or constant."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from currytrain.optim.builders import build_scheduler, lr_multiplier


def test_warmup_rises_linearly_to_the_peak():
    assert [lr_multiplier(step, 100, "cosine", 4, 0.1) for step in range(4)] == [0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_decay_ends_at_min_lr_ratio(kind):
    assert lr_multiplier(4, 104, kind, 4, 0.1) == pytest.approx(1.0)
    assert lr_multiplier(104, 104, kind, 4, 0.1) == pytest.approx(0.1)
    assert lr_multiplier(500, 104, kind, 4, 0.1) == pytest.approx(0.1)  # past the end: stays at the floor


def test_cosine_and_linear_differ_midway_and_constant_stays_flat():
    assert lr_multiplier(54, 104, "cosine", 4, 0.0) == pytest.approx(0.5)
    assert lr_multiplier(29, 104, "cosine", 4, 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.25)))
    assert lr_multiplier(29, 104, "linear", 4, 0.0) == pytest.approx(0.75)
    assert all(lr_multiplier(step, 104, "constant", 4, 0.1) == 1.0 for step in range(4, 200))


def test_the_scheduler_drives_the_optimizer_lr():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=2.0)
    scheduler = build_scheduler(optimizer, OmegaConf.create({"kind": "cosine", "warmup_steps": 2, "min_lr_ratio": 0.1}), total_steps=10)
    seen = []
    for _ in range(10):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen[:3] == [1.0, 2.0, 2.0]
    assert seen[-1] == pytest.approx(2.0 * lr_multiplier(9, 10, "cosine", 2, 0.1))
    assert all(a >= b for a, b in zip(seen[1:], seen[2:]))


def test_the_default_warmup_is_a_share_of_the_run_so_a_one_step_run_validates(compose_cfg):
    from currytrain.validate import validate

    cfg = compose_cfg("optimizer.schedule.warmup_steps=null", "trainer.max_steps=1")
    assert validate(cfg) == []  # a fixed warmup of 30 refused this smoke run
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    build_scheduler(optimizer, cfg.optimizer.schedule, total_steps=1200)  # the default run: 5% = 60 steps
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1 / 60)
    explicit = compose_cfg("optimizer.schedule.warmup_steps=7")
    build_scheduler(optimizer := torch.optim.SGD([param], lr=1.0), explicit.optimizer.schedule, total_steps=1200)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1 / 7)


def test_a_bad_warmup_ratio_or_an_explicit_warmup_past_the_run_names_the_key(compose_cfg):
    from currytrain.validate import validate

    (ratio,) = validate(compose_cfg("optimizer.schedule.warmup_steps=null", "optimizer.schedule.warmup_ratio=1.0"))
    assert "optimizer.schedule.warmup_ratio=1.0 must be in [0, 1)" in ratio
    (steps,) = validate(compose_cfg("optimizer.schedule.warmup_steps=6", "trainer.max_steps=6"))
    assert "optimizer.schedule.warmup_steps=6 is not below trainer.max_steps=6" in steps and "or null" in steps
