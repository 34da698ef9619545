"""Stage scaling: fit L(N) = E + A * N^-alpha to runs at several model sizes, then extrapolate.

Each size is the configured model at another width (model.dim, hidden sizes scaled alike), trained for the
same number of steps, so every run sees the same tokens D and its compute is C = 6 N D; the compute form
L(C) = E + B * C^-alpha is the same fit with N replaced by C. The fitted quantity is each run's final val loss:
the quantity whose seed-to-seed noise the seeds stage measures. The largest size is held out and predicted
from the others, and the gate weighs the miss against the noise measured in the same run
(currytrain.stats.held_out_test): the fit's bootstrap spread plus the seed noise of one run, with the degrees
of freedom of the seeds it was measured on. That noise is, in order: `seed_std` when given (taken as known),
the std the seeds stage of this ladder measured, else the std of `noise_seeds` extra seeds of the held-out
size, which this stage then trains. A miss above the prediction with p below `fail_alpha` fails; below `alpha`
warns. A held-out size that does better than predicted passes, with a note that the fit is pessimistic.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from currytrain.check import figures
from currytrain.check.budget import scaled, steps_text
from currytrain.check.probes import at_chance, data_chance
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status, crash_finding
from currytrain.check.subruns import SubRun, budget_overrides, derive, seed_overrides, shared_data, train_subrun, width_overrides, width_skipped
from currytrain.components import Components
from currytrain.stats.fits import MAX_ALPHA, PowerLawFit, fit_power_law, held_out_test

__all__ = ["Noise", "PowerLawFit", "Scaling", "fit_power_law", "held_out_finding", "scaling_findings", "width_overrides"]


@dataclass(frozen=True)
class Noise:
    """The seed-to-seed std of one run's loss and where it comes from."""

    std: float
    dof: float
    """Seeds it was measured on minus one; inf for a value taken as known."""
    source: str


def held_out_finding(fit: PowerLawFit, name: str, num_params: int, measured: list[float], noise: Noise, alpha: float, fail_alpha: float) -> Finding:
    """The held-out size's mean loss against the fit's prediction, in units of the fit's spread and the noise."""
    test = held_out_test(fit, num_params, measured, noise.std, noise.dof)
    low, high = test.interval(1 - alpha)
    runs = f"mean of {len(measured)} seeds" if len(measured) > 1 else "one seed"
    observed = (
        f"{name} ({num_params:,} params): measured {test.measured:.4f} ({runs}), predicted {test.predicted:.4f} "
        f"[{low:.4f}, {high:.4f}], p = {test.p:.3g} (noise {noise.std:.3g}: {noise.source})"
    )
    expected = (
        f"the held-out size inside the fit's {1 - alpha:.0%} interval, which adds the seed noise measured in this run "
        f"(warns above it at p < {alpha:g}, fails at p < {fail_alpha:g}; below it, the larger size does better than promised, passes)"
    )
    if test.p >= alpha:
        return Finding("held-out size", Status.PASSED, observed, expected)
    if test.measured < test.predicted:
        # Better than the smaller sizes promise: nothing fails to scale. Healthy small models do this whenever the
        # smaller sizes are still on the uniform loss's plateau (bench/ladder_calibration.py: the scaffolded 2-layer lm
        # at most seeds), so it passes, saying what it means for the fit.
        observed += (
            "; below the power law of the smaller sizes beyond their fit and the seed noise: the larger size learns what the smaller "
            "ones have not yet (a plateau they are still on, or a capability that comes with size), so extrapolations from this fit "
            "are pessimistic (more check.stages.scaling.max_steps moves every size past the plateau)"
        )
        return Finding("held-out size", Status.PASSED, observed, expected)
    cause = (
        "the held-out size lands above the power law of the smaller sizes by more than their fit and the seed noise explain "
        "(too few steps for the larger model, a size past saturation, or a width-dependent bug: an init or lr that does not scale)"
    )
    fix = "use more steps (check.stages.scaling.max_steps), sizes further apart, check=capacity for the saturation, check=mup for width-dependence"
    return Finding("held-out size", Status.FAILED if test.p < fail_alpha else Status.WARNING, observed, expected, cause, fix)


def scaling_findings(
    sizes: list[int],
    losses: list[float],
    held_name: str,
    held_size: int,
    held_losses: list[float],
    noise: Noise,
    *,
    bootstrap: int = 500,
    seed: int = 0,
    tokens: int = 0,
    target_params: int = 0,
    alpha: float = 0.05,
    fail_alpha: float = 0.001,
    chance: float | None = None,
) -> tuple[list[Finding], PowerLawFit | None]:
    """The stage's assessment of measured losses: the fit, the held-out test, the extrapolation. It never raises:
    values no power law fits (not finite, one distinct size) are a failed finding that says so."""
    try:
        fit = fit_power_law(sizes, losses, bootstrap, seed, noise.std if math.isfinite(noise.std) else 0.0)
    except ValueError as error:
        return [
            Finding("scaling fit", Status.FAILED, str(error), f"a power law through {len(sizes)} sizes", "the runs gave no losses to fit", "see the runs")
        ], None
    try:
        low, high = fit.alpha_interval()
        observed = f"L(N) = {fit.e:.3f} + {fit.a:.3g} N^-{fit.alpha:.3f} (alpha 95% CI [{low:.3f}, {high:.3f}])"
        undetermined = low <= 0.01 and high >= MAX_ALPHA - 0.1
        if undetermined:
            observed += f": alpha undetermined within the fit's bounds [0, {MAX_ALPHA:g}]"
        if tokens:
            observed += f"; compute form L(C) = E + {fit.a * (6 * tokens) ** fit.alpha:.3g} C^-{fit.alpha:.3f} at D = {tokens:,} tokens"
        fitted = f"a power law through {len(sizes)} sizes" + (f" that leave chance ln C = {chance:.3f}" if chance is not None else "")
        if all(at_chance(loss, chance) for loss in losses):
            cause = (
                "every fitted size ends at chance: the fit runs through untrained models, so neither its exponent nor the held-out "
                "test says how the model scales"
            )
            fix = "raise check.stages.scaling.max_steps (and check.stages.seeds.max_steps with it), or check the lr (check=lr_range)"
            findings = [Finding("scaling fit", Status.WARNING, observed + f"; losses {', '.join(f'{v:.3f}' for v in losses)}", fitted, cause, fix)]
        else:
            findings = [Finding("scaling fit", Status.PASSED, observed, fitted)]
        if not held_losses or not all(math.isfinite(v) for v in held_losses):
            findings.append(
                Finding("held-out size", Status.FAILED, f"{held_name}: loss {held_losses}", "a finite loss", "the held-out size diverged", "lower optimizer.lr")
            )
        else:
            findings.append(held_out_finding(fit, held_name, held_size, held_losses, noise, alpha, fail_alpha))
        if target_params:
            low_t, high_t = fit.prediction_interval(target_params)
            text = f"{fit.predict(target_params):.4f} [{low_t:.4f}, {high_t:.4f}] at {target_params:,} params"
            expected = "the predicted val loss at target_params (95%), from a determined exponent"
            if undetermined:
                cause = "alpha spans the fit's whole range: the extrapolation is the fit's bounds, not a prediction"
                findings.append(Finding("extrapolation", Status.WARNING, text, expected, cause, "more sizes, sizes further apart, more steps"))
            else:
                findings.append(Finding("extrapolation", Status.PASSED, text, expected))
    except Exception as error:  # an assessment never crashes the stage
        return [crash_finding("scaling assessment", error)], fit
    return findings, fit


def measured_noise(ctx: StageContext, seed_std: float) -> Noise | None:
    """The noise of one run known before this stage trains: seed_std when given, else the seeds stage's."""
    if seed_std > 0:
        return Noise(seed_std, math.inf, "check.stages.scaling.seed_std, taken as known")
    std, count = ctx.measured.get("seed_std"), ctx.measured.get("seed_count", 0)
    if std is not None and math.isfinite(std) and count >= 2:
        return Noise(float(std), count - 1, f"std of {count} seeds measured by the seeds stage")
    return None


class Scaling(Stage):
    """Runs at several widths, a power-law fit with bootstrap intervals, a held-out size weighed against seed noise.
    Thresholds: ScalingConfig."""

    name = "scaling"
    needs_components = False

    def __init__(
        self,
        widths: list[int] = (32, 48, 64, 96, 128),
        max_steps: int | None = 100,
        bootstrap: int = 500,
        target_params: int = 0,
        seed_std: float = 0.0,
        noise_seeds: int = 2,
        alpha: float = 0.05,
        fail_alpha: float = 0.001,
    ):
        self.widths, self.max_steps, self.bootstrap, self.target_params = sorted(widths), max_steps, bootstrap, target_params
        self.seed_std, self.noise_seeds, self.alpha, self.fail_alpha = seed_std, noise_seeds, alpha, fail_alpha
        self.configured_steps = max_steps
        self.runs: list[SubRun] = []
        self.replicates: list[SubRun] = []
        """Extra seeds of the held-out size (trained when no seed noise was measured before this stage)."""
        self.fit: PowerLawFit | None = None
        self.data = None
        self.param_counts: list[int] = []
        """The ladder's data adapter (its classes give the figure's chance line)."""

    scalable = True
    FLOOR = 40
    """Fewest steps a budget leaves each size (the seeds stage, whose noise the gate uses, keeps as many)."""

    def cost(self, ctx: StageContext, costs) -> float:
        """Each width's run at its parameters, and the held-out width's extra seeds when no seeds stage measures the noise."""
        from currytrain.estimate import count_parameters

        if "dim" not in ctx.cfg.model:
            return 0.0
        steps = self.max_steps or int(ctx.cfg.trainer.max_steps)
        if len(self.param_counts) != len(self.widths):  # built on the meta device once: the plan asks many times
            self.param_counts = [count_parameters(derive(ctx.cfg, width_overrides(ctx.cfg.model, width)).model) for width in self.widths]
        params = self.param_counts
        runs = [costs.subrun(steps, params=count) for count in params]
        measured = self.seed_std > 0 or "seeds" in ctx.cfg.check.get("stages", {})
        return sum(runs) + (0 if measured else self.noise_seeds * runs[-1]) + (self.bootstrap + 1) * costs.fit

    def scale(self, factor: float) -> None:
        if self.configured_steps:
            self.max_steps = scaled(self.configured_steps, factor, self.FLOOR)

    def planned_steps(self) -> str | None:
        return steps_text(self.configured_steps, self.max_steps)

    def assess(self, parts: Components | None, ctx: StageContext) -> StageResult:
        result = StageResult(self.name)
        if "dim" not in ctx.cfg.model:
            result.findings.append(width_skipped("scaling fit"))
            return result
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
        noise = measured_noise(ctx, self.seed_std)
        if noise is None:
            base = int(ctx.cfg.seed)
            overrides = budget + width_overrides(ctx.cfg.model, self.widths[-1])
            self.replicates = [
                train_subrun(ctx, self.name, f"{held.name}_seed_{base + i}", overrides + seed_overrides(ctx, base + i)) for i in range(1, self.noise_seeds + 1)
            ]
            values = [held.val_loss] + [run.val_loss for run in self.replicates]
            std = statistics.stdev(values) if len(values) >= 2 and all(math.isfinite(v) for v in values) else 0.0
            noise = Noise(std, len(values) - 1, f"std of {len(values)} seeds of {held.name} trained here")
        held_losses = [held.val_loss] + [run.val_loss for run in self.replicates]
        trainer = ctx.cfg.trainer
        tokens = (self.max_steps or trainer.max_steps) * trainer.batch_size * trainer.grad_accum * int(getattr(shared_data(ctx, ctx.cfg), "seq_len", 0))
        findings, self.fit = scaling_findings(
            [r.num_params for r in fitted],
            [r.val_loss for r in fitted],
            held.name,
            held.num_params,
            held_losses,
            noise,
            bootstrap=self.bootstrap,
            seed=int(ctx.cfg.seed),
            tokens=tokens,
            target_params=self.target_params,
            alpha=self.alpha,
            fail_alpha=self.fail_alpha,
            chance=data_chance(shared_data(ctx, ctx.cfg)),
        )
        result.findings += findings
        if ctx.state.is_main and self.fit is not None:
            self.data = shared_data(ctx, ctx.cfg)
            result.figures.append(self.figure(Path(ctx.run_dir) / "scaling.png"))
        result.details = "\n".join(
            ["| run | parameters | val loss | train loss (last 10%) |", "|---|---:|---:|---:|"]
            + [f"| {r.name} | {r.num_params:,} | {r.val_loss:.4f} | {r.train_loss:.4f} |" for r in self.runs + self.replicates]
        )
        return result

    def figure(self, path: Path) -> Path:
        fitted = self.runs[:-1]
        top = max(self.target_params, self.runs[-1].num_params)
        grid = list(np.geomspace(fitted[0].num_params, top, 50))
        curve = (grid, [self.fit.predict(n) for n in grid])
        held = self.runs[-1]
        marks = {f"held out ({held.name})": (held.num_params, statistics.fmean([held.val_loss] + [r.val_loss for r in self.replicates]))}
        if self.target_params:
            marks["prediction"] = (self.target_params, self.fit.predict(self.target_params))
        xs, ys = [r.num_params for r in fitted], [r.val_loss for r in fitted]
        chance = data_chance(self.data) if self.data is not None else None
        return figures.scatter_fit(path, xs, ys, curve, ("parameters N", "val loss (nats/token)"), "scaling: L(N) = E + A N^-alpha", marks, chance)
