"""The statistics core behind every verdict (compare, seeds, ablation, scaling, sweeps): tests, intervals, effect
sizes, seeds-needed, Holm, equivalence, and power-law fits with bootstrap. numpy and scipy only, so every layer
above may use it; the contract `stats-pure` in .importlinter keeps torch, Hydra and OmegaConf out."""

from currytrain.stats.fits import HeldOut, PowerLawFit, fit_power_law, held_out_test, prediction_interval
from currytrain.stats.tests import (
    PAIRED_T,
    TESTS,
    WELCH,
    WILCOXON,
    Comparison,
    bootstrap_interval,
    cohens_d,
    detectable_effect,
    equivalence_p,
    holm,
    paired_t,
    power,
    seeds_needed,
    welch,
    wilcoxon,
)
from currytrain.stats.verdict import BETTER, DIRECTIONS, EQUIVALENT, INCONCLUSIVE, WORSE, Verdict, classify, compare_samples, decide, decide_many, no_verdict

__all__ = [
    "BETTER",
    "DIRECTIONS",
    "EQUIVALENT",
    "INCONCLUSIVE",
    "PAIRED_T",
    "TESTS",
    "WELCH",
    "WILCOXON",
    "WORSE",
    "Comparison",
    "HeldOut",
    "PowerLawFit",
    "Verdict",
    "bootstrap_interval",
    "classify",
    "cohens_d",
    "compare_samples",
    "decide",
    "decide_many",
    "detectable_effect",
    "equivalence_p",
    "fit_power_law",
    "held_out_test",
    "holm",
    "no_verdict",
    "paired_t",
    "power",
    "prediction_interval",
    "seeds_needed",
    "welch",
    "wilcoxon",
]
