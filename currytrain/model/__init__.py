"""Model architectures (conf/model/). Each family lives in its own module; import them directly.

Beyond forward(tokens) -> logits, a model may implement three optional methods that the trainer uses:

- auxiliary_loss() -> Tensor: the weighted sum of the extra losses of the last forward pass
  (MoE load balancing, router z-loss); added to the task loss before backward.
- training_metrics() -> dict[str, float]: per-layer statistics of the last forward pass
  (expert load, drop rate, spike rate), logged with the train metrics.
- mup_hidden_matrices() -> HiddenMatrices: with model.mup=true, the weights the optimizer builder
  trains with a width-scaled learning rate (muP).

Every family subclasses Decoder (decoder.py): embedding, blocks in `model.layers` (an nn.ModuleList, where
parallelize_decoder wraps them), final norm, readout, init and muP; the family file keeps its blocks.
Build a model with build_model(cfg.model), which leaves out the config fields applied from outside.

The protocols are in currytrain.model.protocol. This package imports no torch, so composing a
config (which imports the config dataclasses beside it) stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from currytrain.build import build
from currytrain.model.config import APPLIED_FROM_OUTSIDE

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from torch import nn


def build_model(cfg: DictConfig) -> nn.Module:
    """The model of `cfg` (the model sub-tree), without the fields parallelize_decoder applies (APPLIED_FROM_OUTSIDE)."""
    return build(cfg, exclude=APPLIED_FROM_OUTSIDE)


def build_shapes(cfg: DictConfig) -> nn.Module:
    """The model of `cfg` on the meta device, its init skipped: shapes for counting and checking, no memory.

    Skipping the init is not only tidier: torch draws meta tensors' normal_ through its Python reference
    kernels, whose first call imports torch._dynamo (about 0.7 s of every validated run's start-up).
    """
    import torch
    from torch.overrides import TorchFunctionMode

    class SkipInit(TorchFunctionMode):
        """Every torch.nn.init function returns its tensor untouched (they all dispatch __torch_function__)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__module__", None) == "torch.nn.init":
                return args[0] if args else kwargs["tensor"]
            return func(*args, **(kwargs or {}))

    with torch.device("meta"), SkipInit():
        return build_model(cfg)
