"""The root config schema and its registration in Hydra's ConfigStore.

Every group option in conf/ is a YAML file whose defaults list names one schema stored here
(`/schema/<group>/<option>`), so a mistyped key fails at composition with Hydra's own message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from currytrain.abort.config import NoAbortConfig
from currytrain.check.config import FullLadderConfig, NoCheckConfig, PreflightCheckConfig, SanityCheckConfig, SkeletonCheckConfig
from currytrain.data.config import StdlibBytesConfig, SyntheticConfig, TextConfig
from currytrain.logger.config import JsonlConfig, TensorBoardConfig
from currytrain.model.config import GQAConfig, MoEConfig, SpikingConfig
from currytrain.optim.config import AdamWConfig, SGDConfig
from currytrain.parallel.config import SingleConfig
from currytrain.sweep.config import NoSweepConfig
from currytrain.trainer.config import TrainerConfig

# group -> option name -> schema. The YAML option <group>/<name>.yaml extends /schema/<group>/<name>.
SCHEMAS: dict[str, dict[str, type]] = {
    "model": {"gqa": GQAConfig, "moe": MoEConfig, "spiking": SpikingConfig},
    "data": {"bytes": StdlibBytesConfig, "text": TextConfig, "synthetic": SyntheticConfig},
    "parallel": {"single": SingleConfig},
    "optimizer": {"adamw": AdamWConfig, "sgd": SGDConfig},
    "logger": {"tensorboard": TensorBoardConfig, "jsonl": JsonlConfig},
    "check": {
        "none": NoCheckConfig,
        "skeleton": SkeletonCheckConfig,
        "preflight": PreflightCheckConfig,
        "sanity": SanityCheckConfig,
        "ladder": FullLadderConfig,
    },
    "sweep": {"none": NoSweepConfig},
    "abort": {"none": NoAbortConfig},
}


@dataclass
class BuildConfig:
    """What build() may instantiate besides curryTrain, experiments/ and torch.optim."""

    allow: list[str] = field(default_factory=list)
    """Extra modules (and their submodules) whose classes and functions configs may name as _target_."""


@dataclass
class RootConfig:
    model: Any = MISSING
    data: Any = MISSING
    parallel: Any = MISSING
    optimizer: Any = MISSING
    logger: dict[str, Any] = field(default_factory=dict)
    check: Any = MISSING
    sweep: Any = MISSING
    abort: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    build: BuildConfig = field(default_factory=BuildConfig)
    seed: int = 0
    """Seeds model init, the data split and every batch: same seed, same loss curve."""


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="root_schema", node=RootConfig)
    for group, options in SCHEMAS.items():
        for name, schema in options.items():
            # Stored outside the option's own group so `Available options in 'model'` lists only real options.
            cs.store(group=f"schema/{group}", name=name, node=schema)
