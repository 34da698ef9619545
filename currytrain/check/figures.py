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
    chance_line(ax, chance)
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
    right.plot(x, stats.grad_norm, marker="o", label="grad norm")
    right.plot(x, stats.grad_max, marker="s", label="grad max |g|")
    right.plot(x, stats.update_ratio, marker="^", label="update / weight")
    right.set_title("block gradients and updates")
    right.legend()
    for ax in (left, right):
        ax.set_xticks(list(x), names, rotation=45, ha="right")
        ax.set_yscale("log")
    left.legend()
    return _save(fig, path)


def chance_line(ax, chance: float | None) -> None:
    """The loss of a uniform guess, ln C, as a dotted line (every loss figure draws it)."""
    if chance is not None:
        ax.axhline(chance, color="gray", linestyle=":", label=f"chance ln(C) = {chance:.2f}")


def lr_range(path: Path, sweep: Any, suggested: float, configured: float, chance: float | None = None) -> Path:
    """Loss against lr (log scale), raw and smoothed, with the suggested and the configured lr, and chance."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(sweep.lrs, sweep.losses, alpha=0.35, label="loss")
    ax.plot(sweep.lrs, sweep.smoothed, label="smoothed")
    ax.axvline(suggested, color="green", linestyle="--", label=f"suggested {suggested:.3g}")
    ax.axvline(configured, color="gray", linestyle=":", label=f"optimizer.lr {configured:.3g}")
    ax.set_xscale("log")
    top = min(max(sweep.smoothed) * 1.2, max(sweep.losses))
    if chance is not None:
        top = max(top, chance * 1.05)
    ax.set_ylim(min(sweep.losses) * 0.95, top)
    chance_line(ax, chance)
    ax.set_xlabel("learning rate")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("lr range test")
    ax.legend()
    return _save(fig, path)


def width_scales(path: Path, widths: list[int], scales: dict[str, list[float]], title: str) -> Path:
    """One line per quantity: its RMS against width (log-log); flat lines are width-invariant."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, values in scales.items():
        ax.plot(widths, values, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("width (model.dim)")
    ax.set_ylabel("RMS")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _save(fig, path)


def scatter_fit(
    path: Path,
    xs: list[float],
    ys: list[float],
    curve: tuple[list[float], list[float]] | None,
    labels: tuple[str, str],
    title: str,
    marks: dict[str, tuple[float, float]] | None = None,
    chance: float | None = None,
) -> Path:
    """Points (log x), an optional fitted curve, named marks, and the chance loss ln C."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(xs, ys, "o", label="runs")
    if curve is not None:
        ax.plot(*curve, "-", label="fit")
    for name, (x, y) in (marks or {}).items():
        ax.plot([x], [y], "s", label=name)
    chance_line(ax, chance)
    ax.set_xscale("log")
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
