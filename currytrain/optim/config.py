"""Typed configs of the optimizer group (conf/optimizer/): the optimizer and its LR schedule."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from currytrain.rules import bounded, one_of

SCHEDULE_KINDS = ("cosine", "linear", "constant")
ADAMW_IMPLEMENTATIONS = ("auto", "fused", "foreach", "for_loop")


@dataclass
class ScheduleConfig:
    """Learning-rate schedule, as a multiplier of optimizer.lr per optimizer step."""

    kind: str = "cosine"
    """cosine (warmup then cosine decay), linear (warmup then linear decay) or constant (warmup then flat)."""
    warmup_steps: int | None = bounded(None, ge=0, example=0)
    """Steps of linear warmup from 0 to lr; null: warmup_ratio of trainer.max_steps."""
    warmup_ratio: float = bounded(0.05, ge=0, lt=1)
    """The warmup as a fraction of trainer.max_steps (rounded down), when warmup_steps is null: a short smoke
    run and a long run both warm up over the same share of their steps."""
    min_lr_ratio: float = bounded(0.1, ge=0, le=1)
    """Floor of the decay, as a fraction of lr."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        return one_of(node, path, "kind", SCHEDULE_KINDS)


def warmup_steps(schedule: Any, total_steps: int) -> int:
    """The schedule's warmup in steps: warmup_steps when set, else warmup_ratio of `total_steps`."""
    if schedule.warmup_steps is not None:
        return int(schedule.warmup_steps)
    return int(schedule.warmup_ratio * total_steps)


@dataclass
class AdamWConfig:
    """torch.optim.AdamW; weight decay applies to matrices only (not norms or biases)."""

    _target_: str = "currytrain.optim.builders.build_adamw"
    lr: float = bounded(3e-3, gt=0)
    """Peak learning rate."""
    betas: list[float] = bounded(default_factory=lambda: [0.9, 0.95], ge=0, lt=1)
    """Adam beta1, beta2."""
    eps: float = bounded(1e-8, gt=0)
    """Adam epsilon."""
    weight_decay: float = bounded(0.1, ge=0)
    """Decoupled weight decay on >=2-D parameters."""
    implementation: str = "auto"
    """fused (one kernel per step over all parameters), foreach (one per op over lists) or for_loop; auto
    picks fused, which torch has for CPU and CUDA tensors."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = one_of(node, path, "implementation", ADAMW_IMPLEMENTATIONS)
        if len(node.betas) != 2:
            problems.append(f"{path}.betas={list(node.betas)} must be two numbers (beta1, beta2): pass {path}.betas=[0.9,0.95]")
        return problems


@dataclass
class SGDConfig:
    """torch.optim.SGD with momentum; weight decay applies to matrices only."""

    _target_: str = "currytrain.optim.builders.build_sgd"
    lr: float = bounded(0.1, gt=0)
    """Peak learning rate."""
    momentum: float = bounded(0.9, ge=0, lt=1)
    """Momentum factor."""
    nesterov: bool = True
    """Nesterov momentum."""
    weight_decay: float = bounded(0.0, ge=0)
    """L2 weight decay on >=2-D parameters."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        if node.nesterov and node.momentum == 0:
            return [f"{path}.nesterov=true needs momentum, but {path}.momentum=0: pass {path}.nesterov=false or {path}.momentum=0.9"]
        return []
