"""The ladder's PNG figures. matplotlib is imported here only, with the Agg backend (no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def overfit_curve(path: Path, losses: list[float], threshold: float, chance: float) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, label="loss on the batch")
    ax.axhline(threshold, color="green", linestyle="--", label=f"gate {threshold:g}")
    ax.axhline(chance, color="gray", linestyle=":", label=f"chance ln(C) = {chance:.2f}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("sanity: overfit one batch")
    ax.legend()
    return _save(fig, path)


def layer_stats(path: Path, names: list[str], stats: Any) -> Path:
    """Activation std/max and gradient norm per block (log scale)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    x = range(len(names))
    left.plot(x, stats.activation_std, marker="o", label="std")
    left.plot(x, stats.activation_max, marker="s", label="max |x|")
    left.set_title("block output activations")
    right.plot(x, stats.grad_norm, marker="o", color="tab:red")
    right.set_title("block gradient norm")
    for ax in (left, right):
        ax.set_xticks(list(x), names, rotation=45, ha="right")
        ax.set_yscale("log")
    left.legend()
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
