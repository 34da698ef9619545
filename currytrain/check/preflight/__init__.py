"""Stage preflight: cheap assertions about the training step, each a probe over the built Components.
The probes live by family beside this module: wiring.py (optimizer, gradients, one step), modes.py
(train/eval, causality), leakage.py (labels, batches, splits) and normalization.py (the loss rule: one batch's
gradient as microbatches and ranks).

optimizer coverage, learning rates per group, frozen parameters, gradient flow, zero_grad between steps, train/eval mode, label
dependence and leakage, causality, train/val overlap and deterministic batches, one step lowers the loss, the loss's
normalization over microbatches and ranks; and, beside them, objective.py (does the loss score the next token and
every token, do ranks and microbatches get different data), state.py (state across forwards and eval passes, tied
weights, weight decay, init scale with depth) and routing.py (the balancing signal of top-k routing).
Data that reports its own leakage checks (tables: data=digits|table, see currytrain.data.pipeline) gets
them as findings here; the probes of token streams (label leakage on random tokens, causality, overlap of
windows) run only when the inputs are token ids.
Every probe that trains does so inside `scratch`, so the next probe sees the model as built.
"""

from collections.abc import Sequence

from currytrain.check.preflight.leakage import batch_determinism, label_dependence, label_leakage, loss_sign, split_leakage, train_val_overlap
from currytrain.check.preflight.modes import causality, train_eval_mode
from currytrain.check.preflight.normalization import loss_normalization
from currytrain.check.preflight.objective import distinct_data, loss_alignment, scored_tokens
from currytrain.check.preflight.routing import routing_balance
from currytrain.check.preflight.state import decayed_parameters, forward_state, residual_growth, tied_weights
from currytrain.check.preflight.wiring import (
    frozen_parameters,
    gradient_flow,
    learning_rates,
    one_step_decreases_loss,
    optimizer_coverage,
    zero_grad_between_steps,
)
from currytrain.check.probes import StepFn, get_batch, train_step
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status, probe
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
        init_growth: float = 3.0,
        balance_response: float = 0.5,
    ):
        self.batch_size, self.allow_frozen = batch_size, list(allow_frozen)
        self.grad_tolerance, self.causal_tolerance = grad_tolerance, causal_tolerance
        self.leak_steps, self.leak_margin = leak_steps, leak_margin
        self.overlap_windows, self.max_overlap, self.warn_overlap = overlap_windows, max_overlap, warn_overlap
        self.slow_group_ratio = slow_group_ratio
        self.init_growth, self.balance_response = init_growth, balance_response
        self.leak_thresholds = {"near_distance": near_distance, "max_duplicate_share": max_duplicate_share, "target_threshold": target_threshold}
        self.step_fn: StepFn = train_step
        """The training step the probes run (tests put a broken one here)."""

    def cost(self, ctx: StageContext, costs) -> float:
        """About 40 steps of batch_size sequences: the leakage probe's, one step at several lrs, the forwards of the others."""
        return costs.build + costs.steps(40, sequences=self.batch_size)

    def assess(self, parts: Components, ctx: StageContext) -> StageResult:
        batch, step = get_batch(parts, self.batch_size), self.step_fn
        states: list[Finding] = []

        def across() -> Finding:
            states[:] = forward_state(parts, batch)
            return states[0]

        probes = {
            "optimizer coverage": lambda: optimizer_coverage(parts),
            "learning rates": lambda: learning_rates(parts, self.slow_group_ratio),
            "weight decay": lambda: decayed_parameters(parts),
            "no frozen parameters": lambda: frozen_parameters(parts, self.allow_frozen),
            # first of the probes that run forwards: an eval pass may change the model for good (the bug it looks for)
            "state across forwards": across,
            "gradient flow": lambda: gradient_flow(parts, batch),
            "zero_grad between steps": lambda: zero_grad_between_steps(parts, step, batch, self.grad_tolerance),
            "tied weights": lambda: tied_weights(parts, step, batch),
            "train/eval mode": lambda: train_eval_mode(parts, step, batch),
            "loss sign": lambda: loss_sign(parts, batch),
            "loss depends on labels": lambda: label_dependence(parts, batch),
            "loss scores the next token": lambda: loss_alignment(parts, batch),
            "every token is scored": lambda: scored_tokens(parts, [get_batch(parts, self.batch_size, step=index) for index in range(4)]),
            "no label leakage": lambda: label_leakage(parts, step, self.batch_size, self.leak_steps, self.leak_margin),
            "causality": lambda: causality(parts, batch, self.causal_tolerance),
            "deterministic batches": lambda: batch_determinism(parts, self.batch_size),
            "distinct data per rank and microbatch": lambda: distinct_data(parts, self.batch_size),
            "no train/val overlap": lambda: train_val_overlap(parts, self.overlap_windows, self.max_overlap, self.warn_overlap),
            "one step lowers the loss": lambda: one_step_decreases_loss(parts, step, batch),
            "loss normalization": lambda: loss_normalization(parts, self.batch_size),
            "routing balance": lambda: routing_balance(parts, batch, self.balance_response),
            "init scale with depth": lambda: residual_growth(parts, batch, self.init_growth),
        }
        if batch[0].is_floating_point():  # rows of features, not token ids: nothing to shift, mask or randomise
            for name in ("no label leakage", "causality", "no train/val overlap"):
                del probes[name]
        findings = []
        for name, run in probes.items():
            findings.append(probe(name, run))
            if name == "state across forwards" and len(states) == 2:
                findings.append(states[1])
        if isinstance(parts.data, HasLeakageReport):
            findings += split_leakage(parts, self.leak_thresholds)
        explain(findings)
        return StageResult(self.name, findings)


CONSEQUENCES = {
    "no label leakage": "loss scores the next token",
    "loss depends on labels": "loss scores the next token",
    "zero_grad between steps": "state across forwards",
}
"""A probe whose failure another probe's failure explains: a loss scored against the inputs ignores the targets and
beats chance on random tokens (it copies them), which the label probes would read as leaked or ignored labels; a
forward whose result changes from call to call gives two identical steps different gradients."""


def explain(findings: list[Finding]) -> None:
    """Report each failure that another failed probe explains under that probe (consequence_of)."""
    failed = {f.name for f in findings if f.status is Status.FAILED}
    for finding in findings:
        cause = CONSEQUENCES.get(finding.name)
        if cause in failed and finding.status is Status.FAILED and not finding.consequence_of:
            finding.consequence_of = cause
            finding.cause = f"a consequence of {cause}'s finding: {finding.cause}"
