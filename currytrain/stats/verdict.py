"""One verdict vocabulary for every comparison curryTrain makes: better, worse, equivalent (within +-delta) or
inconclusive, each with its interval, p-value, test and number of seeds, at a stated alpha.

The rule: a difference whose p-value (Holm-adjusted when one baseline meets several configs) is below alpha is
better or worse, by the metric's direction; otherwise, when an equivalence margin delta is given and the two
one-sided tests put the difference inside +-delta, equivalent; otherwise inconclusive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from currytrain.stats.tests import TESTS, Comparison, equivalence_p, holm, paired_t, seeds_needed, welch, wilcoxon

BETTER, WORSE, EQUIVALENT, INCONCLUSIVE = "better", "worse", "equivalent", "inconclusive"
DIRECTIONS = ("minimize", "maximize")


def classify(difference, p, alpha: float, direction: str = "minimize", p_equivalence=None) -> np.ndarray:
    """The verdict word of each comparison (vectorized): the one rule every caller and every simulation uses."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r}: choose one of {list(DIRECTIONS)}")
    lower = np.asarray(difference) < 0
    improved = lower if direction == "minimize" else ~lower
    word = np.where(np.asarray(p) < alpha, np.where(improved, BETTER, WORSE), INCONCLUSIVE)
    if p_equivalence is not None:
        word = np.where((word == INCONCLUSIVE) & (np.asarray(p_equivalence) < alpha), EQUIVALENT, word)
    return word


@dataclass(frozen=True)
class Verdict:
    word: str
    candidate: str
    baseline: str
    comparison: Comparison
    alpha: float
    direction: str
    p: float
    """The p-value the word was decided on: Holm-adjusted when `family` > 1."""
    family: int = 1
    """How many configs were compared with the same baseline (Holm's m)."""
    delta: float | None = None
    p_equivalence: float | None = None
    unit: str = ""

    @property
    def difference(self) -> float:
        return self.comparison.difference

    @property
    def interval(self) -> tuple[float, float]:
        return self.comparison.low, self.comparison.high

    @property
    def seeds(self) -> str:
        n = self.comparison.n
        return f"{n[0]} paired seeds" if len(n) == 1 else f"{n[0]} + {n[1]} seeds"

    @property
    def numbers(self) -> str:
        """The difference with its interval, p, the test, the seeds and alpha."""
        unit = f" {self.unit}" if self.unit else ""
        low, high = self.interval
        level = f"{100 * (1 - self.alpha):g}%"
        p = f"p = {_p_text(self.p)}" + (f" (Holm over {self.family})" if self.family > 1 else "")
        return f"{self.difference:+.4f}{unit} [{low:+.4f}, {high:+.4f}] ({level}), {p}, {self.comparison.test}, {self.seeds}, alpha {self.alpha:g}"

    @property
    def text(self) -> str:
        """One line: the word, then the numbers."""
        unit = f" {self.unit}" if self.unit else ""
        numbers = self.numbers
        if self.word in (BETTER, WORSE):
            return f"{self.candidate} is {self.word} than {self.baseline}: {numbers}"
        if self.word == EQUIVALENT:
            return f"{self.candidate} is equivalent to {self.baseline} within ±{self.delta:g}{unit}: {numbers}, TOST p = {_p_text(self.p_equivalence)}"
        margin = f", TOST p = {_p_text(self.p_equivalence)} for ±{self.delta:g}" if self.delta is not None else ""
        return f"{self.candidate} vs {self.baseline}: inconclusive, {numbers}{margin}"

    def advice(self, effect: float | None = None) -> str:
        """How many seeds per config would detect `effect` (default: the difference measured) with 80% power."""
        effect = abs(self.difference) if effect is None else effect
        a, b = self.comparison.samples
        noise = float(np.std(b - a, ddof=1)) if self.comparison.paired else float(np.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2))
        need = seeds_needed(noise, effect, self.alpha, paired=self.comparison.paired)
        return f"{need} seeds per config would detect {effect:.4f} with 80% power at alpha {self.alpha:g} (seed std {noise:.4f})"


def _p_text(p: float) -> str:
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def compare_samples(baseline: Sequence[float], candidate: Sequence[float], paired: bool, alpha: float = 0.05, test: str = "t") -> Comparison:
    """Paired (same seeds, same order) by `test` ('t' or 'wilcoxon'), else Welch."""
    if not paired:
        return welch(baseline, candidate, alpha)
    if test not in TESTS:
        raise ValueError(f"test={test!r}: choose one of {list(TESTS)}")
    return (paired_t if test == "t" else wilcoxon)(baseline, candidate, alpha)


def decide(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    paired: bool,
    alpha: float = 0.05,
    direction: str = "minimize",
    delta: float | None = None,
    test: str = "t",
    names: tuple[str, str] = ("baseline", "candidate"),
    unit: str = "",
) -> Verdict:
    """The verdict on one candidate against its baseline."""
    (verdict,) = decide_many(
        baseline, {names[1]: (candidate, paired)}, alpha=alpha, direction=direction, delta=delta, test=test, baseline_name=names[0], unit=unit
    )
    return verdict


def decide_many(
    baseline: Sequence[float] | dict[str, Sequence[float]],
    candidates: dict[str, tuple[Sequence[float], bool]],
    *,
    alpha: float = 0.05,
    direction: str = "minimize",
    delta: float | None = None,
    test: str = "t",
    baseline_name: str = "baseline",
    unit: str = "",
) -> list[Verdict]:
    """Each candidate (values, paired) against the baseline, Holm-corrected over the candidates. A dict baseline
    holds the baseline's values as each candidate pairs them ({candidate name: values})."""
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha}: choose a level in (0, 0.5), e.g. 0.05 or 0.01")
    if delta is not None and not delta > 0:
        raise ValueError(f"delta={delta}: the equivalence margin must be > 0")
    comparisons = {}
    for name, (values, paired) in candidates.items():
        base = baseline[name] if isinstance(baseline, dict) else baseline
        comparisons[name] = compare_samples(base, values, paired, alpha, test)
    adjusted = holm([c.p for c in comparisons.values()]) if comparisons else []
    verdicts = []
    for (name, comparison), p in zip(comparisons.items(), adjusted):
        p_eq = float(equivalence_p(comparison, delta)) if delta is not None else None
        p_eq = min(1.0, p_eq * len(comparisons)) if p_eq is not None else None  # Bonferroni on equivalence claims
        word = str(classify(comparison.difference, p, alpha, direction, p_eq))
        verdicts.append(Verdict(word, name, baseline_name, comparison, alpha, direction, float(p), len(comparisons), delta, p_eq, unit))
    return verdicts


def no_verdict(candidate: str, baseline: str, values: dict[str, int], noise: float, effect: float, alpha: float = 0.05) -> str:
    """Why no test can be made (a config with fewer than 2 seeds), and how many seeds would do."""
    counts = ", ".join(f"{name}: {n}" for name, n in values.items())
    if math.isfinite(noise):
        need = seeds_needed(noise, effect, alpha)
        return f"{candidate} vs {baseline}: no verdict ({counts} seeds); at the seed std measured here ({noise:.4f}) {need} seeds per config would detect {abs(effect):.4f}"
    return f"{candidate} vs {baseline}: no verdict ({counts} seeds), seed noise unknown: run at least 3 seeds per config (python launch.py -m seed=0,1,2 ...)"
