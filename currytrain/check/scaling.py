"""Stage scaling: fit L(N) = E + A * N^-alpha to runs at several model sizes, then extrapolate.

Each size is the configured model at another width (model.dim, hidden sizes scaled alike), trained for the
same number of steps, so every run sees the same tokens D and its compute is C = 6 N D; the compute form
L(C) = E + B * C^-alpha is the same fit with N replaced by C. The fit and its bootstrap intervals are
currytrain.stats.fits: the prediction's interval adds the noise of one run, the fit's residual std or, when
`seed_std` gives a measured seed-to-seed std (check=seeds' std), the larger of the two, which then also
drives the bootstrap. The largest size is held out: it is predicted from the others, and the gate is that
its measured loss lies inside the stated interval.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from currytrain.check import figures
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status
from currytrain.check.subruns import SubRun, budget_overrides, train_subrun, width_overrides
from currytrain.components import Components
from currytrain.stats.fits import PowerLawFit, fit_power_law

__all__ = ["PowerLawFit", "Scaling", "fit_power_law", "held_out_finding", "width_overrides"]


def held_out_finding(fit: PowerLawFit, held: SubRun) -> Finding:
    low, high = fit.prediction_interval(held.num_params)
    predicted = fit.predict(held.num_params)
    observed = f"{held.name} ({held.num_params:,} params): measured {held.train_loss:.4f}, predicted {predicted:.4f} [{low:.4f}, {high:.4f}]"
    expected = "the measured loss inside the 95% prediction interval of the fit to the smaller sizes"
    if low <= held.train_loss <= high:
        return Finding("held-out size", Status.PASSED, observed, expected)
    return Finding(
        "held-out size",
        Status.FAILED,
        observed,
        expected,
        "the smaller sizes do not predict the larger one: the loss is not a power law of size here (too few steps, a "
        "size past saturation, or noise larger than the gaps between sizes)",
        "use more steps (check.stages.scaling.max_steps), sizes further apart, or check=capacity to find the saturation",
    )


class Scaling(Stage):
    """Runs at several widths, a power-law fit with bootstrap intervals, a held-out size. Thresholds: ScalingConfig."""

    name = "scaling"
    needs_components = False

    def __init__(
        self, widths: list[int] = (32, 48, 64, 96, 128), max_steps: int | None = 100, bootstrap: int = 500, target_params: int = 0, seed_std: float = 0.0
    ):
        self.widths, self.max_steps, self.bootstrap, self.target_params = sorted(widths), max_steps, bootstrap, target_params
        self.seed_std = seed_std
        self.runs: list[SubRun] = []
        self.fit: PowerLawFit | None = None

    def assess(self, parts: Components | None, ctx: StageContext) -> StageResult:
        result = StageResult(self.name)
        budget = budget_overrides(self.max_steps, [])
        self.runs = [train_subrun(ctx, self.name, f"dim_{w}", budget + width_overrides(ctx.cfg.model, w)) for w in self.widths]
        failed = [run.name for run in self.runs if not run.finished]
        if failed:
            result.findings.append(
                Finding(
                    "scaling fit", Status.FAILED, f"runs that did not finish: {', '.join(failed)}", "every size trains", "a size diverged", "lower optimizer.lr"
                )
            )
            return result
        *fitted, held = self.runs
        self.fit = fit_power_law([r.num_params for r in fitted], [r.train_loss for r in fitted], self.bootstrap, int(ctx.cfg.seed), self.seed_std)
        low, high = self.fit.alpha_interval()
        trainer = ctx.cfg.trainer
        tokens = (self.max_steps or trainer.max_steps) * trainer.batch_size * trainer.grad_accum * ctx.cfg.data.seq_len
        observed = f"L(N) = {self.fit.e:.3f} + {self.fit.a:.3g} N^-{self.fit.alpha:.3f} (alpha 95% CI [{low:.3f}, {high:.3f}]); compute form L(C) = E + {self.fit.a * (6 * tokens) ** self.fit.alpha:.3g} C^-{self.fit.alpha:.3f} at D = {tokens:,} tokens"
        result.findings.append(Finding("scaling fit", Status.PASSED, observed, f"a power law through {len(fitted)} sizes"))
        result.findings.append(held_out_finding(self.fit, held))
        if self.target_params:
            low_t, high_t = self.fit.prediction_interval(self.target_params)
            text = f"{self.fit.predict(self.target_params):.4f} [{low_t:.4f}, {high_t:.4f}] at {self.target_params:,} params"
            result.findings.append(Finding("extrapolation", Status.PASSED, text, "the predicted train loss at target_params (95%)"))
        if ctx.state.is_main:
            result.figures.append(self.figure(Path(ctx.run_dir) / "scaling.png"))
        result.details = "\n".join(
            ["| run | parameters | train loss (last 10%) | val loss |", "|---|---:|---:|---:|"]
            + [f"| {r.name} | {r.num_params:,} | {r.train_loss:.4f} | {r.val_loss:.4f} |" for r in self.runs]
        )
        return result

    def figure(self, path: Path) -> Path:
        fitted = self.runs[:-1]
        top = max(self.target_params, self.runs[-1].num_params)
        grid = list(np.geomspace(fitted[0].num_params, top, 50))
        curve = (grid, [self.fit.predict(n) for n in grid])
        held = self.runs[-1]
        marks = {f"held out ({held.name})": (held.num_params, held.train_loss)}
        if self.target_params:
            marks["prediction"] = (self.target_params, self.fit.predict(self.target_params))
        xs, ys = [r.num_params for r in fitted], [r.train_loss for r in fitted]
        return figures.scatter_fit(path, xs, ys, curve, ("parameters N", "train loss (nats/token)"), "scaling: L(N) = E + A N^-alpha", marks)
