"""model=mlp: a multilayer perceptron classifier, the model of tables of features (data=digits, data=table).

It takes (batch, in_features) floats and returns (batch, num_classes) logits, which the trainer's
cross-entropy reads as it reads a decoder's (batch, seq, vocab) ones. Its hidden layers sit in
`model.layers` so that parallelize_decoder's activation checkpointing and FSDP apply unchanged.
"""

from __future__ import annotations

import torch
from torch import nn


class MLPClassifier(nn.Module):
    def __init__(self, in_features: int, num_classes: int, dim: int = 128, n_layers: int = 2, dropout: float = 0.0):
        super().__init__()
        widths = [in_features] + [dim] * n_layers
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(a, b), nn.GELU(), nn.Dropout(dropout)) for a, b in zip(widths, widths[1:]))
        self.output = nn.Linear(dim, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        hidden = features
        for layer in self.layers:
            hidden = layer(hidden)
        return self.output(hidden)
