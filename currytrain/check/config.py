"""Typed configs of the check group (conf/check/): the ladder's options and the thresholds of each stage.

An option of the group is a ladder: an ordered dict of stages, each a node with the `_target_` of its Stage
class and that stage's thresholds. check=skeleton and check=preflight run one stage, check=sanity the
first three, check=ladder every stage that exists. A user's stage is one more entry of `check.stages`
whose `_target_` lives in experiments/ (see docs/ladder.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from currytrain.rules import at_least, positive


@dataclass
class NoCheckConfig:
    """check=none: train directly, no validation-ladder stage."""

    _target_: str | None = None


@dataclass
class SkeletonConfig:
    """Stage skeleton: build everything, one forward pass, shapes, parameter counts, component origins."""

    _target_: str = "currytrain.check.skeleton.Skeleton"
    batch_size: int = 2
    """Sequences in the batch the stage inspects and runs forward."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        return at_least(node, path, ("batch_size",))


@dataclass
class PreflightConfig:
    """Stage preflight: assertions about the training step that take seconds (see docs/ladder.md)."""

    _target_: str = "currytrain.check.preflight.Preflight"
    batch_size: int = 4
    """Sequences per batch in every probe of this stage."""
    allow_frozen: list[str] = field(default_factory=list)
    """Parameter-name prefixes that are frozen on purpose (requires_grad=False); any other frozen parameter fails."""
    grad_tolerance: float = 1e-5
    """Relative difference allowed between the gradients of two identical steps (zero_grad probe)."""
    causal_tolerance: float = 1e-4
    """Largest change of the logits at positions <= t allowed when tokens after t change (relative to their scale)."""
    leak_steps: int = 10
    """Steps trained on uniformly random tokens in the leakage probe."""
    leak_margin: float = 0.25
    """Nats below ln(data vocabulary) the loss on random tokens may reach before the labels count as leaked
    (a model that cannot see the labels stays within noise of ln(V): it cannot memorise fresh random windows)."""
    overlap_windows: int = 64
    """Val windows (of data.seq_len tokens) searched for in the train stream."""
    max_overlap: float = 0.25
    """Largest share of those val windows allowed to occur verbatim in the train stream."""
    near_distance: float = 0.05
    """Tables (data=digits|table): a val row within this root-mean-square distance of a train row, per feature
    in train standard deviations, is a near duplicate."""
    max_duplicate_share: float = 0.0
    """Tables: largest share of val (or test) rows allowed an exact or near duplicate in train."""
    target_threshold: float = 0.99
    """Tables: a feature that alone predicts at least this share of the val classes encodes the target."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = at_least(node, path, ("batch_size", "leak_steps", "overlap_windows"))
        problems += positive(node, path, "grad_tolerance", 1e-5) + positive(node, path, "causal_tolerance", 1e-4)
        problems += positive(node, path, "leak_margin", 0.25)
        if not 0 <= node.max_overlap <= 1:
            problems.append(f"{path}.max_overlap={node.max_overlap} must be in [0, 1]: pass {path}.max_overlap=0.25")
        if not 0 <= node.max_duplicate_share <= 1:
            problems.append(f"{path}.max_duplicate_share={node.max_duplicate_share} must be in [0, 1]: pass {path}.max_duplicate_share=0.0")
        problems += positive(node, path, "near_distance", 0.05) + positive(node, path, "target_threshold", 0.99)
        return problems


@dataclass
class SanityConfig:
    """Stage sanity: init loss vs chance, overfit one batch, per-layer gradient and activation statistics."""

    _target_: str = "currytrain.check.sanity.Sanity"
    init_batches: int = 4
    """Val batches (of batch_size sequences) averaged for the loss at init."""
    batch_size: int = 8
    """Sequences per batch for the init loss and the layer statistics."""
    init_tolerance: float = 0.5
    """Nats the loss at init may differ from ln(vocab_size) (a uniform prediction)."""
    overfit_sequences: int = 3
    """Sequences in the one batch the model must memorise."""
    overfit_steps: int = 300
    """Most optimizer steps allowed to memorise it (stops as soon as the loss is below overfit_loss)."""
    overfit_loss: float = 0.2
    """Loss (nats/token) the batch must go below: the gate."""
    stats_steps: int = 5
    """Training steps over which per-layer gradient and activation statistics are gathered."""
    vanishing_ratio: float = 1e-3
    """Warn when one block's gradient norm is below this fraction of another's (vanishing/exploding with depth)."""
    activation_growth: float = 100.0
    """Warn when the activation std grows by more than this factor from the first block to the last."""
    dead_fraction: float = 0.5
    """Warn when more than this share of a block's linear-layer inputs is zero on every token (dead units)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = at_least(node, path, ("init_batches", "batch_size", "overfit_sequences", "overfit_steps", "stats_steps"))
        problems += positive(node, path, "init_tolerance", 0.5) + positive(node, path, "overfit_loss", 0.2)
        problems += positive(node, path, "vanishing_ratio", 1e-3) + positive(node, path, "activation_growth", 100.0)
        if not 0 < node.dead_fraction <= 1:
            problems.append(f"{path}.dead_fraction={node.dead_fraction} must be in (0, 1]: pass {path}.dead_fraction=0.5")
        return problems


@dataclass
class LadderConfig:
    """The stages to climb, in order; the first failed gate stops the ladder (exit code 3)."""

    _target_: str = "currytrain.check.ladder.Ladder"
    stages: dict[str, Any] = field(default_factory=dict)
    """Stage name -> its config (a `_target_` Stage class and its thresholds), run in this order."""
    stop_at_failure: bool = True
    """Stop at the first stage whose gate fails; false runs every stage and fails at the end."""


@dataclass
class SkeletonCheckConfig(LadderConfig):
    """check=skeleton: the skeleton stage alone."""

    stages: dict[str, Any] = field(default_factory=lambda: {"skeleton": SkeletonConfig()})


@dataclass
class PreflightCheckConfig(LadderConfig):
    """check=preflight: the preflight stage alone (seconds)."""

    stages: dict[str, Any] = field(default_factory=lambda: {"preflight": PreflightConfig()})


@dataclass
class SanityCheckConfig(LadderConfig):
    """check=sanity: skeleton, preflight, then sanity."""

    stages: dict[str, Any] = field(default_factory=lambda: {"skeleton": SkeletonConfig(), "preflight": PreflightConfig(), "sanity": SanityConfig()})


@dataclass
class FullLadderConfig(LadderConfig):
    """check=ladder: every stage that exists, in order (part 2 adds the pre-validation stages)."""

    stages: dict[str, Any] = field(default_factory=lambda: {"skeleton": SkeletonConfig(), "preflight": PreflightConfig(), "sanity": SanityConfig()})
