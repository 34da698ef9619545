"""Optional model hooks the trainer checks for (see the package docstring)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class HasAuxiliaryLoss(Protocol):
    def auxiliary_loss(self) -> torch.Tensor: ...


@runtime_checkable
class HasTrainingMetrics(Protocol):
    def training_metrics(self) -> dict[str, float]: ...
