"""Typed config of the cost group (conf/cost/): one accelerator's throughput and price, for `currytrain estimate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from currytrain.rules import bounded, one_of

DEVICES = ("cpu", "cuda")


@dataclass
class CostConfig:
    """An accelerator to price a run on. The prices are list prices to edit for your provider."""

    _target_: str | None = None
    """Nothing is built from it: `currytrain estimate` reads its fields."""
    name: str = "H100 SXM"
    """What the report calls it."""
    device: str = "cuda"
    """cpu or cuda: when this kind of device is present here, the step time is measured on it instead of assumed."""
    peak_flops: float = bounded(989e12, gt=0)
    """Dense peak FLOP/s of one device at the run's precision (H100 SXM bf16: 989e12)."""
    measure: bool = True
    """Measure the step time when a device of this kind is present here; false always assumes mfu (pass it when
    the GPU here is not the one priced)."""
    mfu: float = bounded(0.4, gt=0, le=1)
    """Model FLOPs utilisation assumed when the device is not present to measure (0.3-0.5 is typical for LLMs large
    enough to fill the device; a small model's step is bound by cost.launch_seconds instead)."""
    launch_seconds: float = bounded(1e-5, ge=0)
    """Host time to launch one kernel in an eager PyTorch step (seconds; about 10 us). A step launches a few kernels per
    parameter tensor and microbatch whatever their size, so this floors the step time of a small model; 0 ignores it."""
    price_per_hour: float = bounded(3.0, ge=0)
    """Money per device-hour (USD)."""
    num_devices: int = bounded(1, ge=1)
    """Devices the run uses; the time divides by it (perfect scaling assumed), the device-hours do not."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        return one_of(node, path, "device", DEVICES)
