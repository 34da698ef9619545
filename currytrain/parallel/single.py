"""parallel=single: one process, one device, the model left as built."""

from __future__ import annotations

from torch import nn

from currytrain.parallel.state import ParallelState, resolve_device


class SingleDevice:
    def __init__(self, nproc: int = 1):
        self.nproc = nproc

    def setup(self, device: str) -> ParallelState:
        return ParallelState(device=resolve_device(device))

    def apply(self, model: nn.Module, state: ParallelState) -> nn.Module:
        """The hook where parallel strategies wrap the model (TP, AC, compile, FSDP in that order)."""
        return model.to(state.device)

    def teardown(self) -> None:
        pass
