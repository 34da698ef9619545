"""Optional model hooks the trainer checks for (see the package docstring)."""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch


@runtime_checkable
class HasAuxiliaryLoss(Protocol):
    def auxiliary_loss(self) -> torch.Tensor: ...


@runtime_checkable
class HasTrainingMetrics(Protocol):
    def training_metrics(self) -> dict[str, float]: ...


class HiddenMatrices(NamedTuple):
    """muP's "hidden" weights: matrices whose fan-in and fan-out both grow with the model's width."""

    width_multiplier: float
    """The model's width over model.mup_base_width (1.0 with muP off)."""
    params: list[torch.nn.Parameter]
    """The hidden matrices themselves; empty with muP off."""


@runtime_checkable
class HasMuP(Protocol):
    def mup_hidden_matrices(self) -> HiddenMatrices: ...
