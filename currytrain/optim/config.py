"""Typed configs of the optimizer group (conf/optimizer/): the optimizer and its LR schedule."""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEDULE_KINDS = ("cosine", "linear", "constant")


@dataclass
class ScheduleConfig:
    """Learning-rate schedule, as a multiplier of optimizer.lr per optimizer step."""

    kind: str = "cosine"
    """cosine (warmup then cosine decay), linear (warmup then linear decay) or constant (warmup then flat)."""
    warmup_steps: int = 30
    """Steps of linear warmup from 0 to lr."""
    min_lr_ratio: float = 0.1
    """Floor of the decay, as a fraction of lr."""


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
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)


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
