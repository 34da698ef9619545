"""Stage preflight: cheap assertions about the training step, each a probe over the built Components.
The probes live by family beside this module: wiring.py (optimizer, gradients, one step), modes.py
(train/eval, causality), leakage.py (labels, batches, splits) and normalization.py (the loss rule: one batch's
gradient as microbatches and ranks).

optimizer coverage, learning rates per group, frozen parameters, gradient flow, zero_grad between steps, train/eval mode, label
dependence and leakage, causality, train/val overlap and deterministic batches, one step lowers the loss, the loss's
normalization over microbatches and ranks.
Data that reports its own leakage checks (tables: data=digits|table, see currytrain.data.pipeline) gets
them as findings here; the probes of token streams (label leakage on random tokens, causality, overlap of
windows) run only when the inputs are token ids.
Every probe that trains does so inside `scratch`, so the next probe sees the model as built.
"""

from collections.abc import Sequence

from currytrain.check.preflight.leakage import batch_determinism, label_dependence, label_leakage, loss_sign, split_leakage, train_val_overlap
from currytrain.check.preflight.modes import causality, train_eval_mode
from currytrain.check.preflight.normalization import loss_normalization
from currytrain.check.preflight.wiring import (
    frozen_parameters,
    gradient_flow,
    learning_rates,
    one_step_decreases_loss,
    optimizer_coverage,
    zero_grad_between_steps,
)
from currytrain.check.probes import StepFn, get_batch, train_step
from currytrain.check.stage import Stage, StageContext, StageResult, probe
from currytrain.components import Components
from currytrain.data import HasLeakageReport


class Preflight(Stage):
    """Seconds of assertions about the training step. The thresholds are PreflightConfig's fields."""

    name = "preflight"

    def __init__(
        self,
        batch_size: int = 4,
        allow_frozen: Sequence[str] = (),
        grad_tolerance: float = 1e-5,
        causal_tolerance: float = 1e-4,
        leak_steps: int = 10,
        leak_margin: float = 0.25,
        overlap_windows: int = 64,
        max_overlap: float = 0.25,
        warn_overlap: float = 0.05,
        slow_group_ratio: float = 30.0,
        near_distance: float = 0.05,
        max_duplicate_share: float = 0.0,
        target_threshold: float = 0.99,
    ):
        self.batch_size, self.allow_frozen = batch_size, list(allow_frozen)
        self.grad_tolerance, self.causal_tolerance = grad_tolerance, causal_tolerance
        self.leak_steps, self.leak_margin = leak_steps, leak_margin
        self.overlap_windows, self.max_overlap, self.warn_overlap = overlap_windows, max_overlap, warn_overlap
        self.slow_group_ratio = slow_group_ratio
        self.leak_thresholds = {"near_distance": near_distance, "max_duplicate_share": max_duplicate_share, "target_threshold": target_threshold}
        self.step_fn: StepFn = train_step
        """The training step the probes run (tests put a broken one here)."""

    def assess(self, parts: Components, ctx: StageContext) -> StageResult:
        batch, step = get_batch(parts, self.batch_size), self.step_fn
        probes = {
            "optimizer coverage": lambda: optimizer_coverage(parts),
            "learning rates": lambda: learning_rates(parts, self.slow_group_ratio),
            "no frozen parameters": lambda: frozen_parameters(parts, self.allow_frozen),
            "gradient flow": lambda: gradient_flow(parts, batch),
            "zero_grad between steps": lambda: zero_grad_between_steps(parts, step, batch, self.grad_tolerance),
            "train/eval mode": lambda: train_eval_mode(parts, step, batch),
            "loss sign": lambda: loss_sign(parts, batch),
            "loss depends on labels": lambda: label_dependence(parts, batch),
            "no label leakage": lambda: label_leakage(parts, step, self.batch_size, self.leak_steps, self.leak_margin),
            "causality": lambda: causality(parts, batch, self.causal_tolerance),
            "deterministic batches": lambda: batch_determinism(parts, self.batch_size),
            "no train/val overlap": lambda: train_val_overlap(parts, self.overlap_windows, self.max_overlap, self.warn_overlap),
            "one step lowers the loss": lambda: one_step_decreases_loss(parts, step, batch),
            "loss normalization": lambda: loss_normalization(parts, self.batch_size),
        }
        if batch[0].is_floating_point():  # rows of features, not token ids: nothing to shift, mask or randomise
            for name in ("no label leakage", "causality", "no train/val overlap"):
                del probes[name]
        findings = [probe(name, run) for name, run in probes.items()]
        if isinstance(parts.data, HasLeakageReport):
            findings += split_leakage(parts, self.leak_thresholds)
        return StageResult(self.name, findings)
