"""Power-law fits L(N) = E + A * N^-alpha with bootstrap intervals, the prediction interval of a new run, and
the test of a held-out run against its prediction.

The fit is scipy's least squares (log A, so that A stays positive; E below every observed loss). Its
uncertainty comes from refits of resampled data: the fit's own residuals when the noise of one run is
unknown, or draws of a measured seed-to-seed std when it is known (with four or five sizes and three
parameters, the residuals alone say little about the noise, and can say it is nearly zero by luck).

Any finite input fits: losses that are not monotone in size, all equal, or two points (the fit is then exact
and the noise must come from seeds). A loss or size that is not finite, or a single distinct size, raises
ValueError naming it: no fit exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

MAX_ALPHA = 5.0
"""The largest exponent the fit considers (steeper is no power law a few sizes can tell)."""


def power_law(n: np.ndarray, e: float, log_a: float, alpha: float) -> np.ndarray:
    with np.errstate(over="ignore"):
        return e + np.exp(log_a - alpha * np.log(n))


def prediction_interval(center: float, predictions: np.ndarray, noise: float, level: float = 0.95, seeds: int = 1) -> tuple[float, float]:
    """Where the mean of `seeds` new runs should land: the fit's spread (bootstrap `predictions` at that point)
    plus the noise of the runs themselves (one run's std `noise`, shrunk by sqrt(seeds))."""
    z = float(stats.norm.ppf((1 + level) / 2))
    spread = math.sqrt(_variance(predictions) + noise**2 / seeds)
    return center - z * spread, center + z * spread


def _variance(values: np.ndarray) -> float:
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    return float(np.var(values)) if values.size >= 2 else 0.0


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
        return float(power_law(np.asarray(n, float), self.e, math.log(self.a) if self.a > 0 else -math.inf, self.alpha))

    def alpha_interval(self, level: float = 0.95) -> tuple[float, float]:
        alphas = np.asarray(self.alphas, float)
        alphas = alphas[np.isfinite(alphas)]
        if alphas.size == 0:
            return self.alpha, self.alpha
        low, high = np.quantile(alphas, [(1 - level) / 2, (1 + level) / 2])
        return float(low), float(high)

    def spread(self, n: float) -> float:
        """Std of the bootstrap refits' predictions at n: the fit's own uncertainty there."""
        return math.sqrt(_variance(np.array([float(power_law(np.asarray(n, float), e, log_a, alpha)) for e, log_a, alpha in self.boot])))

    def prediction_interval(self, n: float, level: float = 0.95, seeds: int = 1) -> tuple[float, float]:
        """Where the mean of `seeds` runs at size n should land: the fit's bootstrap spread plus their noise."""
        predictions = np.array([float(power_law(np.asarray(n, float), e, log_a, alpha)) for e, log_a, alpha in self.boot])
        return prediction_interval(self.predict(n), predictions, self.noise, level, seeds)


@dataclass(frozen=True)
class HeldOut:
    """A held-out size's measured mean loss against the fit's prediction, in units of the noise."""

    predicted: float
    measured: float
    se: float
    """Standard error of measured - predicted: the fit's spread and the noise of the measured mean."""
    dof: float
    """Degrees of freedom of the noise estimate (inf when the noise is taken as known)."""
    p: float
    """Two-sided p-value of "the held-out size follows the fit" (Student t with dof degrees of freedom)."""

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        half = float(stats.t.ppf((1 + level) / 2, self.dof)) * self.se if math.isfinite(self.se) else math.inf
        return self.predicted - half, self.predicted + half


def held_out_test(fit: PowerLawFit, n: float, measured: list[float], noise: float, dof: float) -> HeldOut:
    """Test the mean of `measured` (runs at size n) against the fit's prediction there. The standard error adds
    the fit's bootstrap spread and the noise of one run (`noise`, with `dof` degrees of freedom: the seeds it was
    measured on minus one, inf for a known value) over the runs averaged; the statistic is Student t on dof."""
    values = np.asarray(measured, float)
    predicted = fit.predict(n)
    mean = float(values.mean()) if values.size else math.nan
    noise = max(float(noise), fit.residual_std)
    se = math.sqrt(fit.spread(n) ** 2 + noise**2 / max(1, values.size))
    dof = float(dof) if dof and dof > 0 else math.inf
    if not (math.isfinite(mean) and math.isfinite(predicted)):
        return HeldOut(predicted, mean, se, dof, 0.0)
    if se == 0:
        return HeldOut(predicted, mean, se, dof, 1.0 if mean == predicted else 0.0)
    t = abs(mean - predicted) / se
    return HeldOut(predicted, mean, se, dof, float(2 * stats.t.sf(t, dof)))


def _least_squares(n: np.ndarray, loss: np.ndarray, start: tuple[float, float, float]) -> tuple[float, float, float]:
    from scipy.optimize import least_squares

    top = float(loss.min())
    bounds = (np.array([-np.inf, -np.inf, 0.0]), np.array([top, np.inf, MAX_ALPHA]))  # E below every observed loss
    # A start on or outside a bound (a bootstrap sample whose lowest loss is below the first fit's E) moves inside.
    x0 = np.array([min(start[0], top - 1e-6 * max(1.0, abs(top))), start[1], min(max(start[2], 1e-3), MAX_ALPHA - 1e-3)], float)
    if not np.isfinite(power_law(n, *x0)).all():
        x0 = np.array(_start(n, loss))
    try:
        fit = least_squares(lambda p: power_law(n, *p) - loss, x0, bounds=bounds, method="trf")
    except ValueError:  # the residuals overflow on the way: keep the start, a curve through the points' middle
        return tuple(float(v) for v in x0)
    return tuple(float(v) for v in fit.x) if np.isfinite(fit.x).all() else tuple(float(v) for v in x0)


def _start(n: np.ndarray, loss: np.ndarray) -> tuple[float, float, float]:
    """E below the lowest loss, alpha from a line through log(loss - E) against log N (kept in (0, 5)), and A so
    that the curve passes through the points' geometric middle (so that no start overflows)."""
    e0 = float(loss.min()) - 0.5 * float(loss.max() - loss.min()) - 1e-3
    log_n, log_gap = np.log(n), np.log(np.maximum(loss - e0, 1e-9))
    slope = np.polyfit(log_n, log_gap, 1)[0] if np.ptp(log_n) > 0 else 0.0
    alpha = float(min(max(-slope, 0.01), MAX_ALPHA - 0.1)) if np.isfinite(slope) else 0.5
    return e0, float(np.mean(log_gap + alpha * log_n)), alpha


def fit_power_law(sizes: list[float], losses: list[float], bootstrap: int = 500, seed: int = 0, seed_std: float = 0.0) -> PowerLawFit:
    """L(N) = E + A N^-alpha by least squares, with `bootstrap` refits for the intervals: of the residuals
    resampled, or of normal draws at the noise of one run when `seed_std` (a measured seed std) is given.

    Raises ValueError for sizes or losses that are not finite (or sizes not positive), for fewer than two
    points, or for a single distinct size."""
    n, loss = np.asarray(sizes, float), np.asarray(losses, float)
    if n.shape != loss.shape or n.ndim != 1:
        raise ValueError(f"sizes and losses must be two lists of one length, got {n.shape} and {loss.shape}")
    bad = [f"{size:g}: {value:g}" for size, value in zip(n, loss) if not (math.isfinite(size) and size > 0 and math.isfinite(value))]
    if bad:
        raise ValueError(f"a power law needs finite losses at positive sizes; not finite or not positive: {', '.join(bad)}")
    if len(np.unique(n)) < 2:
        raise ValueError(f"a power law needs at least two distinct sizes, got {sorted(set(n.tolist()))}")
    e, log_a, alpha = _least_squares(n, loss, _start(n, loss))
    fitted = power_law(n, e, log_a, alpha)
    residuals = loss - fitted
    dof = max(1, len(n) - 3)
    residual_std = math.sqrt(float(residuals @ residuals) / dof)
    noise = max(residual_std, float(seed_std) if math.isfinite(seed_std) else 0.0)
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(bootstrap):
        if seed_std > 0:
            sample = fitted + rng.normal(0.0, noise, len(n))
        else:
            sample = fitted + rng.choice(residuals, size=len(n), replace=True) * math.sqrt(len(n) / dof)
        if np.isfinite(sample).all():
            boot.append(_least_squares(n, sample, (e, log_a, alpha)))
    return PowerLawFit(e, math.exp(min(log_a, 700.0)), alpha, [b[2] for b in boot], residual_std, boot, float(seed_std) if math.isfinite(seed_std) else 0.0)
