"""The tests behind every verdict: paired t and Wilcoxon signed-rank when two configs share seeds, Welch's t
when they do not, bootstrap intervals, effect sizes, Holm's correction and the two one-sided tests (TOST) of
equivalence. Each test takes arrays whose last axis holds the seeds, so one call makes one comparison or many
thousands at once (the tests' simulations of error rates go through these same functions)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

PAIRED_T, WILCOXON, WELCH = "paired t", "Wilcoxon signed-rank", "Welch t"
TESTS = {"t": PAIRED_T, "wilcoxon": WILCOXON}
"""The paired tests by the name a caller chooses them with; unpaired samples always get Welch's t."""


@dataclass(frozen=True)
class Comparison:
    """candidate - baseline, by one test: arrays over the leading axes of the samples, floats for one comparison."""

    test: str
    difference: np.ndarray
    """Mean difference (paired t, Welch), or the Hodges-Lehmann shift (Wilcoxon)."""
    low: np.ndarray
    high: np.ndarray
    """The (1 - alpha) interval of the difference."""
    p: np.ndarray
    """Two-sided p-value of 'no difference'."""
    effect: np.ndarray
    """Standardized effect: Cohen's d (Welch) or d_z, the mean difference over the differences' std (paired)."""
    n: tuple[int, ...]
    """Seeds: (pairs,) for a paired test, (baseline seeds, candidate seeds) for Welch."""
    alpha: float
    samples: tuple[np.ndarray, np.ndarray]
    """(baseline, candidate) as given: the equivalence test reads them."""
    se: np.ndarray = math.nan
    dof: np.ndarray = math.nan
    """Standard error and degrees of freedom of a t-test's difference (nan for Wilcoxon)."""

    @property
    def paired(self) -> bool:
        return self.test != WELCH


def _t_test(test, difference, se, dof, effect, n, alpha, samples) -> Comparison:
    """The t machinery both t-tests share; a zero standard error (identical runs) is a certain answer, not a NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, difference / np.where(se > 0, se, 1), np.where(difference == 0, 0.0, np.sign(difference) * np.inf))
    p = 2 * stats.t.sf(np.abs(t), dof)
    half = stats.t.ppf(1 - alpha / 2, dof) * se
    low, high = _out(difference - half), _out(difference + half)
    return Comparison(test, _out(difference), low, high, _out(p), _out(effect), n, alpha, samples, _out(se), _out(dof))


def _out(value: np.ndarray):
    value = np.asarray(value, float)
    return float(value) if value.ndim == 0 else value


def _samples(baseline, candidate) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(baseline, float), np.asarray(candidate, float)
    if a.shape[-1] < 2 or b.shape[-1] < 2:
        raise ValueError(f"a test needs at least 2 seeds per config, got {a.shape[-1]} and {b.shape[-1]}")
    return a, b


def paired_t(baseline, candidate, alpha: float = 0.05) -> Comparison:
    """Student's t on the per-seed differences candidate - baseline (same seeds, in the same order)."""
    a, b = _samples(baseline, candidate)
    d = b - a
    n = d.shape[-1]
    mean, sd = d.mean(-1), d.std(-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        effect = np.where(sd > 0, mean / np.where(sd > 0, sd, 1), 0.0)
    return _t_test(PAIRED_T, mean, sd / math.sqrt(n), n - 1, effect, (n,), alpha, (a, b))


def welch(baseline, candidate, alpha: float = 0.05) -> Comparison:
    """Welch's t on the difference of means, with the Welch-Satterthwaite degrees of freedom (unrelated seeds)."""
    a, b = _samples(baseline, candidate)
    na, nb = a.shape[-1], b.shape[-1]
    va, vb = a.var(-1, ddof=1), b.var(-1, ddof=1)
    se2 = va / na + vb / nb
    with np.errstate(divide="ignore", invalid="ignore"):
        dof = np.where(se2 > 0, se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1)), na + nb - 2)
    difference = b.mean(-1) - a.mean(-1)
    return _t_test(WELCH, difference, np.sqrt(se2), dof, cohens_d(a, b), (na, nb), alpha, (a, b))


def cohens_d(baseline, candidate) -> np.ndarray:
    """(mean(candidate) - mean(baseline)) / pooled std; 0 when both samples are constant and equal."""
    a, b = np.asarray(baseline, float), np.asarray(candidate, float)
    na, nb = a.shape[-1], b.shape[-1]
    pooled = np.sqrt(((na - 1) * a.var(-1, ddof=1) + (nb - 1) * b.var(-1, ddof=1)) / (na + nb - 2))
    difference = b.mean(-1) - a.mean(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pooled > 0, difference / np.where(pooled > 0, pooled, 1), np.where(difference == 0, 0.0, np.sign(difference) * np.inf))


def signed_rank_counts(n: int) -> np.ndarray:
    """counts[w] = how many of the 2^n sign patterns give a signed-rank sum W+ = w (the exact null, no ties)."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1
    for rank in range(1, n + 1):
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    return counts


def wilcoxon(baseline, candidate, alpha: float = 0.05) -> Comparison:
    """Wilcoxon's signed-rank test on the per-seed differences: scipy's p-value (exact for small n without ties),
    and the Hodges-Lehmann shift with its exact distribution-free interval from the Walsh averages."""
    a, b = _samples(baseline, candidate)
    d = b - a
    n = d.shape[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        p = stats.wilcoxon(d, axis=-1, zero_method="wilcox").pvalue
    p = np.where(np.isnan(p), 1.0, p)  # every difference zero: nothing to reject
    i, j = np.triu_indices(n)
    walsh = np.sort((d[..., i] + d[..., j]) / 2, axis=-1)
    cumulative = np.cumsum(signed_rank_counts(n)) / 2.0**n
    k = int(np.searchsorted(cumulative, alpha / 2, side="right"))  # P(W+ <= k - 1) <= alpha / 2
    if k == 0:  # too few seeds for any interval at this alpha (n = 5 at 0.05): it is unbounded
        low, high = np.full(d.shape[:-1], -np.inf), np.full(d.shape[:-1], np.inf)
    else:
        low, high = walsh[..., k - 1], walsh[..., walsh.shape[-1] - k]
    sd = d.std(-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        effect = np.where(sd > 0, d.mean(-1) / np.where(sd > 0, sd, 1), 0.0)
    return Comparison(WILCOXON, _out(np.median(walsh, -1)), _out(low), _out(high), _out(p), _out(effect), (n,), alpha, (a, b))


def equivalence_p(comparison: Comparison, delta: float) -> np.ndarray:
    """TOST: the larger p of the two one-sided tests 'difference <= -delta' and 'difference >= +delta'. Below
    alpha, the difference lies within +-delta (the (1 - 2 alpha) interval lies inside it)."""
    if comparison.test == WILCOXON:
        a, b = comparison.samples
        d = b - a
        with np.errstate(divide="ignore", invalid="ignore"):
            lower = stats.wilcoxon(d + delta, axis=-1, alternative="greater").pvalue
            upper = stats.wilcoxon(d - delta, axis=-1, alternative="less").pvalue
        return _out(np.fmax(np.nan_to_num(lower, nan=1.0), np.nan_to_num(upper, nan=1.0)))
    difference, se, dof = np.asarray(comparison.difference), np.asarray(comparison.se), np.asarray(comparison.dof)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.fmax(stats.t.sf((difference + delta) / se, dof), stats.t.cdf((difference - delta) / se, dof))
    inside = np.abs(difference) < delta  # identical runs (se 0): certainly inside, or certainly not
    return _out(np.where(se > 0, p, np.where(inside, 0.0, 1.0)))


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjustment over the last axis: reject where adjusted p < alpha keeps the chance of any
    false claim among the m comparisons (one baseline against m configs) at most alpha."""
    p = np.asarray(p_values, float)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ranked = np.take_along_axis(p, order, -1) * (m - np.arange(m))
    adjusted_sorted = np.minimum(np.maximum.accumulate(ranked, axis=-1), 1.0)
    adjusted = np.empty_like(adjusted_sorted)
    np.put_along_axis(adjusted, order, adjusted_sorted, -1)
    return adjusted


def bootstrap_interval(values, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """BCa bootstrap interval of the mean of `values` (percentile where BCa is degenerate). With a handful of
    seeds it is narrower than the t interval: report it beside the test, never instead of it."""
    values = np.asarray(values, float)
    if len(values) < 2 or np.all(values == values[0]):
        return float(values.mean()), float(values.mean())
    for method in ("BCa", "percentile"):
        with np.errstate(invalid="ignore", divide="ignore"):
            found = stats.bootstrap((values,), np.mean, confidence_level=level, n_resamples=resamples, method=method, rng=np.random.default_rng(seed))
        low, high = found.confidence_interval
        if np.isfinite(low) and np.isfinite(high):
            return float(low), float(high)
    return float(values.mean()), float(values.mean())


def power(effect: float, noise: float, seeds: int, alpha: float = 0.05, paired: bool = False) -> float:
    """The chance a two-sided t-test at `alpha` calls a true difference `effect` with `seeds` seeds per config
    (pairs when paired). `noise` is one seed's std: of a config's value, or of the paired difference when paired.
    Exact, from the noncentral t distribution."""
    if paired:
        dof, shift = seeds - 1, effect / (noise / math.sqrt(seeds))
    else:
        dof, shift = 2 * seeds - 2, effect / (noise * math.sqrt(2 / seeds))
    critical = stats.t.ppf(1 - alpha / 2, dof)
    return float(stats.nct.sf(critical, dof, shift) + stats.nct.cdf(-critical, dof, shift))


def seeds_needed(noise: float, effect: float, alpha: float = 0.05, target: float = 0.8, paired: bool = False, limit: int = 100_000) -> float:
    """Fewest seeds per config (>= 2) whose t-test has `target` power for `effect` at seed std `noise`; inf
    when no effect or none up to `limit`."""
    if not effect or not math.isfinite(effect) or not math.isfinite(noise):
        return math.inf
    if noise == 0:
        return 2
    high = 2
    while power(abs(effect), noise, high, alpha, paired) < target:
        if high > limit:
            return math.inf
        high *= 2
    low = max(2, high // 2)
    while low < high:  # power grows with seeds: bisect for the first that reaches the target
        middle = (low + high) // 2
        low, high = (middle + 1, high) if power(abs(effect), noise, middle, alpha, paired) < target else (low, middle)
    return low


def detectable_effect(noise: float, seeds: int, alpha: float = 0.05, target: float = 0.8, paired: bool = False) -> float:
    """The smallest true difference `seeds` seeds per config detect with `target` power (inverse of seeds_needed)."""
    from scipy.optimize import brentq

    if not noise or not math.isfinite(noise):
        return 0.0 if noise == 0 else math.nan
    top = noise
    while power(top, noise, seeds, alpha, paired) < target:
        top *= 2
    return float(brentq(lambda effect: power(effect, noise, seeds, alpha, paired) - target, 0.0, top, xtol=1e-12 * top))
