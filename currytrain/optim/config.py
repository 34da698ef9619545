"""Typed configs of the optimizer group (conf/optimizer/): the optimizer and its LR schedule."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from currytrain.rules import one_of, positive

SCHEDULE_KINDS = ("cosine", "linear", "constant")
ADAMW_IMPLEMENTATIONS = ("auto", "fused", "foreach", "for_loop")


@dataclass
class ScheduleConfig:
    """Learning-rate schedule, as a multiplier of optimizer.lr per optimizer step."""

    kind: str = "cosine"
    """cosine (warmup then cosine decay), linear (warmup then linear decay) or constant (warmup then flat)."""
    warmup_steps: int | None = None
    """Steps of linear warmup from 0 to lr; null: warmup_ratio of trainer.max_steps."""
    warmup_ratio: float = 0.05
    """The warmup as a fraction of trainer.max_steps (rounded down), when warmup_steps is null: a short smoke
    run and a long run both warm up over the same share of their steps."""
    min_lr_ratio: float = 0.1
    """Floor of the decay, as a fraction of lr."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = one_of(node, path, "kind", SCHEDULE_KINDS)
        if node.warmup_steps is not None and not node.warmup_steps >= 0:
            problems.append(f"{path}.warmup_steps={node.warmup_steps} must be >= 0: pass {path}.warmup_steps=0")
        if not 0 <= node.warmup_ratio < 1:
            problems.append(f"{path}.warmup_ratio={node.warmup_ratio} must be in [0, 1): pass {path}.warmup_ratio=0.05")
        if not 0 <= node.min_lr_ratio <= 1:
            problems.append(f"{path}.min_lr_ratio={node.min_lr_ratio} must be in [0, 1]: pass {path}.min_lr_ratio=0.1")
        return problems


def warmup_steps(schedule: Any, total_steps: int) -> int:
    """The schedule's warmup in steps: warmup_steps when set, else warmup_ratio of `total_steps`."""
    if schedule.warmup_steps is not None:
        return int(schedule.warmup_steps)
    return int(schedule.warmup_ratio * total_steps)


def lr_and_decay_problems(node: Any, path: str) -> list[str]:
    problems = [] if node.lr > 0 and node.lr != float("inf") else [f"{path}.lr={node.lr} must be a finite number > 0: pass e.g. {path}.lr=3e-4"]
    if not node.weight_decay >= 0:
        problems.append(f"{path}.weight_decay={node.weight_decay} must be >= 0: pass {path}.weight_decay=0.1")
    return problems


@dataclass
class AdamWConfig:
    """torch.optim.AdamW; weight decay applies to matrices only (not norms or biases)."""

    _target_: str = "currytrain.optim.builders.build_adamw"
    lr: float = 3e-3
    """Peak learning rate."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """Adam beta1, beta2."""
    eps: float = 1e-8
    """Adam epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay on >=2-D parameters."""
    implementation: str = "auto"
    """fused (one kernel per step over all parameters), foreach (one per op over lists) or for_loop; auto
    picks fused, which torch has for CPU and CUDA tensors."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = lr_and_decay_problems(node, path) + one_of(node, path, "implementation", ADAMW_IMPLEMENTATIONS)
        if len(node.betas) != 2 or not all(0 <= b < 1 for b in node.betas):
            problems.append(f"{path}.betas={list(node.betas)} must be two numbers in [0, 1): pass {path}.betas=[0.9,0.95]")
        return problems + positive(node, path, "eps", 1e-8)


@dataclass
class SGDConfig:
    """torch.optim.SGD with momentum; weight decay applies to matrices only."""

    _target_: str = "currytrain.optim.builders.build_sgd"
    lr: float = 0.1
    """Peak learning rate."""
    momentum: float = 0.9
    """Momentum factor."""
    nesterov: bool = True
    """Nesterov momentum."""
    weight_decay: float = 0.0
    """L2 weight decay on >=2-D parameters."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = lr_and_decay_problems(node, path)
        if not 0 <= node.momentum < 1:
            problems.append(f"{path}.momentum={node.momentum} must be in [0, 1): pass {path}.momentum=0.9")
        elif node.nesterov and node.momentum == 0:
            problems.append(f"{path}.nesterov=true needs momentum, but {path}.momentum=0: pass {path}.nesterov=false or {path}.momentum=0.9")
        return problems
