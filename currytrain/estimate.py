"""What a run will need before it runs: parameters counted exactly on the meta device (nothing allocated),
then bytes of weights, gradients, optimizer state and activations per process.

Validation refuses a run whose estimate exceeds the device's memory, so `model.dim=1000000` gets a number
and a fix instead of an attempt to allocate terabytes. The activation term is a rough upper estimate
(what autograd keeps per token and layer in a pre-norm GQA/SwiGLU block, plus the logits); the
parameter, gradient and optimizer terms are exact for fp32 AdamW.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from omegaconf import DictConfig

GiB = 2**30
OPTIMIZER_STATES = {"currytrain.optim.builders.build_adamw": 2, "currytrain.optim.builders.build_sgd": 1}
"""fp32 tensors of state per parameter (AdamW: two moments; SGD: momentum)."""


@dataclass
class MemoryEstimate:
    num_params: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    data: int = 0
    """Bytes of a data source generated in memory (data=synthetic)."""
    rough: bool = False
    """num_params is an upper estimate from the size fields (a model too large to build even on the meta device)."""

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.data

    def describe(self) -> str:
        parts = [("weights", self.weights), ("gradients", self.gradients), ("optimizer state", self.optimizer), ("activations", self.activations)]
        parts += [("data", self.data)] if self.data else []
        count = f"{'about ' if self.rough else ''}{self.num_params:,} parameters"
        return f"{self.total / GiB:,.1f} GiB ({', '.join(f'{name} {size / GiB:,.1f}' for name, size in parts)}; {count})"


def count_parameters(model_cfg: DictConfig) -> int:
    """Exact, from the model built on the meta device: shapes only, no memory."""
    from currytrain.model import build_shapes

    model = build_shapes(model_cfg)
    return sum(p.numel() for p in model.parameters())


def rough_parameters(model: DictConfig) -> int | None:
    """An upper estimate of a decoder's (or classifier's) parameters, RoPE tables included, from its size fields
    alone; None for a model without them (a project's own). Cheap where building would not be: n_layers=10**11."""

    def size(key: str) -> int:
        value = model.get(key, 0)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    dim, layers = size("dim"), size("n_layers")
    if not dim or not layers:
        return None
    heads, kv_heads = max(1, size("n_heads")), max(1, size("n_kv_heads"))
    head = size("head_dim") or max(1, dim // heads)
    attention = dim * head * (heads + 2 * kv_heads) + heads * head * dim
    mlp = 3 * dim * size("mlp_hidden") + size("num_experts") * (3 * dim * size("expert_hidden") + dim)
    embeddings = 2 * (size("vocab_size") + size("in_features") + size("num_classes")) * dim
    return embeddings + layers * (attention + mlp + 2 * dim) + size("max_seq_len") * head


def data_bytes(data: DictConfig) -> int:
    """Bytes a data source generates in memory before training (data=synthetic: its int32 streams)."""
    num_tokens = data.get("num_tokens", 0)
    return int(num_tokens * 1.1) * 4 if isinstance(num_tokens, int) and num_tokens > 0 else 0


def estimate_memory(cfg: DictConfig, limit: int | None = None) -> MemoryEstimate:
    """Bytes one process needs for the run `cfg` (fp32 weights, gradients and optimizer state). With `limit`, a
    model whose rough size (rough_parameters) alone needs more than it is not built, even on the meta device."""
    model, trainer = cfg.model, cfg.trainer
    rough = rough_parameters(model)
    too_big = limit is not None and rough is not None and 16 * rough > limit
    num_params = rough if too_big else count_parameters(model)
    tokens = trainer.batch_size * cfg.data.get("seq_len", 1)  # tables (data=digits) have one row per example
    element = 2 if trainer.precision in ("bf16", "fp8") else 4
    hidden = model.get("expert_hidden", 0) * model.get("top_k", 0) + model.get("mlp_hidden", 0)
    per_token_layer = 10 * model.get("dim", 0) + 4 * hidden  # norms, q/k/v, attention out, residuals; SwiGLU's three
    if model.get("ac", "none") == "full":
        per_token_layer = model.get("dim", 0)  # only each block's input is kept
    activations = tokens * model.get("n_layers", 0) * per_token_layer * element * model.get("timesteps", 1)
    # A classifier (model=mlp) has num_classes outputs where a decoder has vocab_size.
    activations += tokens * model.get("vocab_size", model.get("num_classes", 0)) * 4 * 3  # logits, their fp32 copy, the loss gradient
    states = OPTIMIZER_STATES.get(cfg.optimizer.get("_target_"), 2)
    return MemoryEstimate(num_params, 4 * num_params, 4 * num_params, 4 * states * num_params, activations, data_bytes(cfg.data), too_big)


def device_memory(device: str) -> tuple[int, str]:
    """(bytes a new run can use, a name for the message) on trainer.device."""
    import torch

    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return torch.cuda.mem_get_info()[1], f"the GPU ({torch.cuda.get_device_name()})"
    return _available_ram(), "this machine's available RAM"


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as file:
            fields = dict(line.split(":", 1) for line in file)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
