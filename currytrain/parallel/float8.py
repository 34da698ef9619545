"""trainer.precision=fp8: the blocks' linear layers train with float8 matmuls (torchao's Float8Linear, rowwise
scaling: each row of the input and each column of the weight gets its own scale), everything else under bf16
autocast; the weights, gradients and optimizer state stay fp32.

torchao is an optional dependency (`pip install 'currytrain[fp8]'`), imported only here. Float8Linear subclasses
nn.Linear and keeps its parameters, so checkpoints, `hf export` and the HF bridge see the same names and shapes as
a bf16 run. On a GPU the float8 matmul needs compute capability 8.9 or newer (H100, L40, RTX 4090); on a CPU torch
runs it too, slowly: there it is for checking a recipe on a small model, not for speed (docs/performance.md).
"""

from __future__ import annotations

from torch import nn

FLOAT8_RECIPE = "rowwise"
"""torchao's recipe: per-row scales, recomputed every step (torchtitan's choice for training from scratch)."""
FLOAT8_MULTIPLE = 16
"""torch._scaled_mm needs both dimensions of a float8 weight to be multiples of 16."""


def float8_linears(model: nn.Module) -> int:
    """Swap each nn.Linear inside model.layers whose sizes are multiples of FLOAT8_MULTIPLE for torchao's Float8Linear,
    in place; returns how many were swapped. The embedding and the output layer stay as they are (their float8 error
    costs more than it saves, torchtitan's default too)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(FLOAT8_RECIPE)

    def eligible(module: nn.Module, name: str) -> bool:
        return (
            name.startswith("layers.")
            and type(module) is nn.Linear
            and module.in_features % FLOAT8_MULTIPLE == 0
            and module.out_features % FLOAT8_MULTIPLE == 0
        )

    before = sum(type(m) is nn.Linear for m in model.modules())
    convert_to_float8_training(model, config=config, module_filter_fn=eligible)
    return before - sum(type(m) is nn.Linear for m in model.modules())
