"""Power-law fits L(N) = E + A * N^-alpha with bootstrap intervals, and the prediction interval of a new run.

The fit is scipy's least squares (log A, so that A stays positive; E below every observed loss). Its
uncertainty comes from refits of resampled data: the fit's own residuals when the noise of one run is
unknown, or draws of a measured seed-to-seed std when it is known (with four or five sizes and three
parameters, the residuals alone say little about the noise, and can say it is nearly zero by luck).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats


def power_law(n: np.ndarray, e: float, log_a: float, alpha: float) -> np.ndarray:
    return e + np.exp(log_a - alpha * np.log(n))


def prediction_interval(center: float, predictions: np.ndarray, noise: float, level: float = 0.95, seeds: int = 1) -> tuple[float, float]:
    """Where the mean of `seeds` new runs should land: the fit's spread (bootstrap `predictions` at that point)
    plus the noise of the runs themselves (one run's std `noise`, shrunk by sqrt(seeds))."""
    z = float(stats.norm.ppf((1 + level) / 2))
    spread = math.sqrt(float(np.var(predictions)) + noise**2 / seeds)
    return center - z * spread, center + z * spread


@dataclass
class PowerLawFit:
    e: float
    a: float
    alpha: float
    alphas: list[float] = field(default_factory=list, repr=False)
    """alpha of every bootstrap refit."""
    residual_std: float = 0.0
    """Std of one point around the fit."""
    boot: list[tuple[float, float, float]] = field(default_factory=list, repr=False)
    seed_std: float = 0.0
    """The seed-to-seed std of one run, when measured (0: unknown, the residuals stand for it)."""

    @property
    def noise(self) -> float:
        """The noise of one run: the larger of the residual std and the measured seed std."""
        return max(self.residual_std, self.seed_std)

    def predict(self, n: float) -> float:
        return float(power_law(np.asarray(n, float), self.e, math.log(self.a), self.alpha))

    def alpha_interval(self, level: float = 0.95) -> tuple[float, float]:
        low, high = np.quantile(self.alphas, [(1 - level) / 2, (1 + level) / 2])
        return float(low), float(high)

    def prediction_interval(self, n: float, level: float = 0.95, seeds: int = 1) -> tuple[float, float]:
        """Where the mean of `seeds` runs at size n should land: the fit's bootstrap spread plus their noise."""
        predictions = np.array([float(power_law(np.asarray(n, float), e, log_a, alpha)) for e, log_a, alpha in self.boot])
        return prediction_interval(self.predict(n), predictions, self.noise, level, seeds)


def _least_squares(n: np.ndarray, loss: np.ndarray, start: tuple[float, float, float]) -> tuple[float, float, float]:
    from scipy.optimize import least_squares

    bounds = ([-np.inf, -np.inf, 0.0], [float(loss.min()), np.inf, 5.0])  # E below every observed loss
    fit = least_squares(lambda p: power_law(n, *p) - loss, start, bounds=bounds, method="trf")
    return tuple(float(v) for v in fit.x)


def fit_power_law(sizes: list[float], losses: list[float], bootstrap: int = 500, seed: int = 0, seed_std: float = 0.0) -> PowerLawFit:
    """L(N) = E + A N^-alpha by least squares, with `bootstrap` refits for the intervals: of the residuals
    resampled, or of normal draws at the noise of one run when `seed_std` (a measured seed std) is given."""
    n, loss = np.asarray(sizes, float), np.asarray(losses, float)
    e0 = float(loss.min()) - 0.5 * float(loss.max() - loss.min()) - 1e-3
    slope = np.polyfit(np.log(n), np.log(np.maximum(loss - e0, 1e-9)), 1)
    start = (e0, float(slope[1]), float(min(max(-slope[0], 0.01), 4.9)))
    e, log_a, alpha = _least_squares(n, loss, start)
    fitted = power_law(n, e, log_a, alpha)
    residuals = loss - fitted
    dof = max(1, len(n) - 3)
    residual_std = math.sqrt(float(residuals @ residuals) / dof)
    noise = max(residual_std, seed_std)
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(bootstrap):
        if seed_std > 0:
            sample = fitted + rng.normal(0.0, noise, len(n))
        else:
            sample = fitted + rng.choice(residuals, size=len(n), replace=True) * math.sqrt(len(n) / dof)
        boot.append(_least_squares(n, sample, (e, log_a, alpha)))
    return PowerLawFit(e, math.exp(log_a), alpha, [b[2] for b in boot], residual_std, boot, seed_std)
