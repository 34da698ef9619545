"""`currytrain estimate`: the compute, time and money a run will cost before it runs.

FLOPs: training FLOPs per token from the model built on the meta device (6 x non-embedding parameters for
forward and backward, plus attention's 12 x layers x dim x seq_len; currytrain.benchmark's formula) times
the tokens. Time: where the cost option's kind of device is present here, from tokens/s measured by the
step benchmark on it; elsewhere from the FLOPs at `cost.mfu` of `cost.peak_flops` per device, over
`cost.num_devices` devices, but never faster than launching the step's kernels (`cost.launch_seconds` each, a few per
parameter tensor): a small model does not fill a large device. Money: device-hours x `cost.price_per_hour`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from omegaconf import DictConfig, OmegaConf


@dataclass
class CostEstimate:
    accelerator: str
    tokens: float
    flops_per_token: float
    flops: float
    seconds: float
    """Wall time on cost.num_devices devices."""
    device_hours: float
    money: float
    method: str
    """measured (tokens/s of the step benchmark here) or assumed (peak FLOP/s x mfu)."""
    tokens_per_s: float
    """Of all devices together."""

    def describe(self) -> str:
        return (
            f"{self.tokens:,.0f} tokens x {self.flops_per_token:,.0f} FLOPs/token = {self.flops:.3g} FLOPs on {self.accelerator}: "
            f"{_duration(self.seconds)} at {self.tokens_per_s:,.0f} tokens/s ({self.method}), "
            f"{self.device_hours:,.2f} device-hours, ${self.money:,.2f}"
        )

    def as_dict(self) -> dict:
        return asdict(self)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:,.1f} h"


def run_tokens(cfg: DictConfig) -> int:
    """Tokens the configured run trains on: max_steps x batch_size x grad_accum x seq_len."""
    trainer = cfg.trainer
    return int(trainer.max_steps * trainer.batch_size * trainer.grad_accum * cfg.data.seq_len)


KERNELS_PER_TENSOR = 6
"""Kernels an eager step launches per parameter tensor and microbatch, roughly: its forward op and the elementwise
ops around it, their backward, the gradient's accumulation (the optimizer's foreach kernels are few)."""


def flops_per_token(cfg: DictConfig) -> float:
    return model_cost(cfg)[0]


def model_cost(cfg: DictConfig) -> tuple[float, int]:
    """(training FLOPs per token, parameter tensors) of the model built on the meta device."""
    from currytrain.benchmark import model_flops_per_token, model_sizes
    from currytrain.model import build_shapes

    model = build_shapes(cfg.model)
    n_layers, width = model_sizes(model, cfg.model)  # any model: its repeated blocks and token width, no field names
    return float(model_flops_per_token(model, n_layers, width, cfg.data.seq_len)), len(list(model.parameters()))


def assumed_tokens_per_s(cfg: DictConfig, per_token: float, tensors: int) -> tuple[float, str]:
    """(tokens/s of all devices, how it was found) without a device to measure: the step's FLOPs at cost.mfu of the
    peak, or, where that is faster, the time to launch its kernels (a small model cannot use a large device)."""
    cost, trainer = cfg.cost, cfg.trainer
    step_tokens = trainer.batch_size * trainer.grad_accum * cfg.data.get("seq_len", 1) / cost.num_devices  # one device's share
    compute = step_tokens * per_token / (cost.peak_flops * cost.mfu)
    launches = KERNELS_PER_TENSOR * tensors * trainer.grad_accum
    floor = launches * cost.launch_seconds
    tokens_per_s = step_tokens / max(compute, floor, 1e-12) * cost.num_devices
    if compute >= floor:
        return tokens_per_s, f"assumed: {cost.mfu:.0%} MFU of {cost.peak_flops:.3g} FLOP/s"
    mfu = tokens_per_s / cost.num_devices * per_token / cost.peak_flops
    return tokens_per_s, (
        f"assumed: bound by kernel launches ({launches} per step x {cost.launch_seconds * 1e6:g} us = {floor * 1e3:.2g} ms), {mfu:.2%} MFU of "
        f"{cost.peak_flops:.3g} FLOP/s; cost.mfu={cost.mfu:.0%} holds for models large enough to fill the device"
    )


def device_present(kind: str) -> bool:
    import torch

    return kind == "cpu" or (kind == "cuda" and torch.cuda.is_available())


def measured_tokens_per_s(cfg: DictConfig, steps: int) -> float:
    """Tokens/s of one device, from the step benchmark on it."""
    from currytrain.benchmark import step_benchmark

    node = OmegaConf.to_container(cfg, resolve=True)
    node["trainer"]["device"] = cfg.cost.device
    return float(step_benchmark(OmegaConf.create(node), steps=steps, warmup=2)["tokens_per_s"])


def estimate_cost(cfg: DictConfig, tokens: float | None = None, measure_steps: int = 5) -> CostEstimate:
    """What `tokens` (default: the configured run's) cost on cfg.cost."""
    cost = cfg.cost
    tokens = float(tokens if tokens is not None else run_tokens(cfg))
    per_token, tensors = model_cost(cfg)
    flops = tokens * per_token
    if cost.measure and device_present(cost.device):
        tokens_per_s, method = measured_tokens_per_s(cfg, measure_steps) * cost.num_devices, f"measured here on {cost.device}"
    else:
        tokens_per_s, method = assumed_tokens_per_s(cfg, per_token, tensors)
    seconds = tokens / tokens_per_s
    hours = seconds * cost.num_devices / 3600
    return CostEstimate(cost.name, tokens, per_token, flops, seconds, hours, hours * cost.price_per_hour, method, tokens_per_s)
