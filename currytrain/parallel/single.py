"""parallel=single: one process, one device; the model gets only what parallelize_decoder applies without a mesh."""

from __future__ import annotations

from omegaconf import DictConfig
from torch import nn

from currytrain.parallel.parallelize import parallelize_decoder
from currytrain.parallel.state import ParallelState, resolve_device


class SingleDevice:
    def __init__(self, nproc: int = 1):
        self.nproc = nproc

    def setup(self, device: str) -> ParallelState:
        return ParallelState(device=resolve_device(device))

    def apply(self, model: nn.Module, state: ParallelState, model_cfg: DictConfig) -> nn.Module:
        """Move the model to this process's device, then parallelize it (TP, AC, compile, FSDP in that order)."""
        return parallelize_decoder(model.to(state.device), state, model_cfg)

    def teardown(self) -> None:
        pass
