"""Stage sanity: the loss at init against chance, overfitting one small batch (the gate), and per-layer
gradient and activation statistics over a few steps (as figures, and as histograms for the loggers)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from currytrain.check import figures
from currytrain.check.budget import FORWARD_SHARE
from currytrain.check.probes import StepFn, chance_loss, eval_loss, get_batch, num_classes, output_size, peak_lr, scratch, train_step
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status, crash_finding, probe
from currytrain.components import Components
from currytrain.logger.base import MultiLogger
from currytrain.model.protocol import find_blocks


def init_loss(parts: Components, batch_size: int, batches: int, tolerance: float) -> Finding:
    """Mean val loss at init vs -log(1/C): a fresh model should spread its bets evenly over C classes."""
    val = [get_batch(parts, batch_size, split="val", step=index) for index in range(batches)]
    observed_loss = sum(eval_loss(parts, batch) for batch in val) / batches
    classes = output_size(parts, val[0])
    chance = chance_loss(classes)
    observed = f"{observed_loss:.4f} nats/token"
    expected = f"-log(1/{classes}) = {chance:.4f} +- {tolerance:g}"
    if math.isfinite(observed_loss) and observed_loss < 0:
        return Finding(
            "init loss",
            Status.FAILED,
            observed,
            expected,
            "a negative loss: a cross-entropy is never below 0, so the loss has the wrong sign (a log-likelihood "
            "returned without its minus): the run maximises the error",
            "return the negative log-likelihood (F.cross_entropy) from the model's loss()",
        )
    if not math.isfinite(observed_loss) or observed_loss > chance + tolerance:
        return Finding(
            "init loss",
            Status.FAILED,
            observed,
            expected,
            "too high: the logits are large at init (init scale too big), or the outputs are not raw logits (double softmax); "
            "skeleton's 'outputs are logits' tells the two apart",
            "lower the init scale (model.init_std for curryTrain's families; 0.02 is usual), and return raw logits",
        )
    if observed_loss < chance - tolerance:
        return Finding(
            "init loss",
            Status.FAILED,
            observed,
            expected,
            "too low: the untrained model beats chance, so the labels leak into the inputs",
            "check the data adapter's batch() (targets must be the inputs shifted by one)",
        )
    return Finding("init loss", Status.PASSED, observed, expected)


@dataclass
class Curve:
    losses: list[float] = field(default_factory=list)


def overfit_one_batch(parts: Components, step: StepFn, sequences: int, max_steps: int, threshold: float, curve: Curve) -> Finding:
    """Train on one fixed batch of `sequences` sequences at the peak lr until the loss is below `threshold`."""
    batch = get_batch(parts, sequences)
    lr = peak_lr(parts)
    with scratch(parts, lr="peak"):
        final = math.inf
        for index in range(max_steps):
            torch.manual_seed(index)
            curve.losses.append(step(parts, batch).loss)
            if not math.isfinite(curve.losses[-1]):
                break
            # The step's loss is from before its update: confirm in eval mode once it dips below the bar.
            if curve.losses[-1] < threshold and (final := eval_loss(parts, batch)) < threshold:
                break
        final = eval_loss(parts, batch)
    losses = curve.losses
    expected = f"< {threshold:g} within {max_steps} steps"
    observed = f"{final:.4f} in eval mode after {len(losses)} steps at lr={lr:g} (train-mode step losses: first {losses[0]:.3f}, lowest {min(losses):.3f})"
    if final < threshold:
        return Finding("overfit one batch", Status.PASSED, observed, expected)
    chance = chance_loss(output_size(parts, batch))
    if not math.isfinite(final) or final > losses[0]:
        cause, fix = f"the loss diverged: lr={lr:g} is too high", "lower optimizer.lr (check=lr_range suggests one) or set trainer.grad_clip=1.0"
    elif min(losses) > chance - 1.5:
        cause = (
            f"the loss cannot go far below chance ln(C)={chance:.2f}: the outputs are bounded (a softmax before the loss: double softmax), "
            "or the gradients do not reach the weights; skeleton's 'outputs are logits' and preflight's 'gradient flow' tell the two apart"
        )
        fix = "return raw logits; run check=preflight for gradient flow"
    else:
        cause, fix = (
            SLOW,
            "raise check.stages.sanity.overfit_steps or optimizer.lr; a too-small model cannot memorise either",
        )
    return Finding("overfit one batch", Status.FAILED, observed, expected, cause, fix)


@dataclass
class LayerStats:
    """Per repeated block (find_blocks), over the stats steps."""

    activation_mean: list[float]
    activation_std: list[float]
    activation_max: list[float]
    grad_norm: list[float]
    dead_fraction: list[float]
    grad_mean: list[float] = field(default_factory=list)
    """Mean gradient entry of the block's parameters (a drift away from 0 is a biased gradient)."""
    grad_std: list[float] = field(default_factory=list)
    grad_max: list[float] = field(default_factory=list)
    """Largest |gradient entry| (a spike that clipping hides in the norm)."""
    update_ratio: list[float] = field(default_factory=list)
    """|weight change of one step| / |weights|: around 1e-3 is healthy; 1e-5 learns nothing, 1e-1 thrashes."""


def _blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The repeated blocks (the model's repeated_blocks(), else found in its module tree)."""
    return find_blocks(model)


def gather_layer_stats(parts: Components, step: StepFn, batch_size: int, steps: int, loggers: MultiLogger) -> LayerStats:
    """Train `steps` steps (restored afterwards), recording each block's output and gradient statistics."""
    blocks = _blocks(parts.model)
    outputs: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(blocks))}
    dead: dict[int, list[float]] = {i: [] for i in range(len(blocks))}
    grads: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(blocks))}
    """Per block, one row per step: norm, mean, std, max |entry|."""
    ratios: dict[int, list[float]] = {i: [] for i in range(len(blocks))}
    before: dict[int, list[torch.Tensor]] = {}
    handles = []
    for index, (_, block) in enumerate(blocks):
        handles.append(block.register_forward_hook(lambda module, args, out, i=index: _keep(outputs[i], out)))
        for linear in (m for m in block.modules() if isinstance(m, torch.nn.Linear)):
            handles.append(linear.register_forward_pre_hook(lambda module, args, i=index: dead[i].append(_dead_share(args[0]))))

    def record_grads(optimizer, args, kwargs):
        for i, (_, block) in enumerate(blocks):
            grads[i].append(_grad_row(block))
            before[i] = [p.detach().clone() for p in block.parameters()]

    def record_update(optimizer, args, kwargs):
        for i, (_, block) in enumerate(blocks):
            params = list(block.parameters())
            change = sum(float((p.detach() - old).float().pow(2).sum()) for p, old in zip(params, before[i]))
            size = sum(float(old.float().pow(2).sum()) for old in before[i])
            ratios[i].append(math.sqrt(change / size) if size > 0 else 0.0)

    handles.append(parts.optimizer.register_step_pre_hook(record_grads))
    handles.append(parts.optimizer.register_step_post_hook(record_update))
    try:
        with scratch(parts):
            for index in range(steps):
                step(parts, get_batch(parts, batch_size, step=index))
                _log_histograms(loggers, blocks, outputs, index)
    finally:
        for handle in handles:
            handle.remove()
    flat = [torch.cat([o.flatten() for o in outs]) if outs else torch.full((1,), float("nan")) for outs in outputs.values()]
    mean = lambda values: sum(values) / len(values) if values else 0.0  # noqa: E731
    rows = [torch.tensor(grads[i]).mean(0) if grads[i] else torch.zeros(4) for i in grads]  # mean over the steps
    return LayerStats(
        activation_mean=[float(x.mean()) for x in flat],
        activation_std=[float(x.std()) if x.numel() > 1 else float("nan") for x in flat],
        activation_max=[float(x.abs().max()) for x in flat],
        grad_norm=[float(row[0]) for row in rows],
        dead_fraction=[mean(dead[i]) for i in dead],
        grad_mean=[float(row[1]) for row in rows],
        grad_std=[float(row[2]) for row in rows],
        grad_max=[float(row[3]) for row in rows],
        update_ratio=[mean(ratios[i]) for i in ratios],
    )


def _grad_row(block: torch.nn.Module) -> list[float]:
    """[norm, mean, std, max |entry|] of the gradient entries of the block's parameters (zeros without any)."""
    entries = [p.grad.detach().float().flatten() for p in block.parameters() if p.grad is not None]
    if not entries:
        return [0.0, 0.0, 0.0, 0.0]
    flat = torch.cat(entries)
    return [float(flat.norm()), float(flat.mean()), float(flat.std()) if flat.numel() > 1 else 0.0, float(flat.abs().max())]


def _first_tensor(out) -> torch.Tensor | None:
    """A block's output tensor: itself, or the first floating tensor of a tuple/list it returns (None if none)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return next((t for t in out if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
    return None


def _keep(outputs: list[torch.Tensor], out) -> None:
    tensor = _first_tensor(out)
    if tensor is not None and tensor.is_floating_point():
        outputs.append(tensor.detach().float())


def _dead_share(x: torch.Tensor) -> float:
    """Share of features (last dim) that are zero on every token: units that never fire."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.numel() == 0:
        return 0.0
    flat = x.detach().reshape(-1, x.shape[-1])
    return float((flat.abs().amax(0) == 0).float().mean())


def _log_histograms(loggers: MultiLogger, blocks, outputs: dict[int, list[torch.Tensor]], step: int) -> None:
    for i, (name, block) in enumerate(blocks):
        if outputs[i]:
            loggers.log_histogram(f"check/activation/{name}", outputs[i][-1].flatten(), step)
        weights = [p.detach().flatten() for p in block.parameters()]
        if weights:
            loggers.log_histogram(f"check/weight/{name}", torch.cat(weights), step)
        gradients = [p.grad.detach().flatten() for p in block.parameters() if p.grad is not None]
        if gradients:
            loggers.log_histogram(f"check/gradient/{name}", torch.cat(gradients), step)


def layer_findings(stats: LayerStats, names: list[str], ratio: float, growth: float, dead_limit: float) -> list[Finding]:
    if not names:
        note = "no repeated blocks found in the model"
        fix = "declare them with repeated_blocks() (currytrain.model.protocol) if the model has any"
        return [Finding(name, Status.SKIPPED, note, "per-block statistics", "", fix) for name in ("layer gradients", "layer activations", "dead units")]
    findings = []
    norms, stds = stats.grad_norm, stats.activation_std
    ran = [i for i in range(len(names)) if not math.isnan(stats.activation_max[i])]  # a block with no output captured: nan
    idle = [names[i] for i in range(len(names)) if i not in ran]
    finite = all(math.isfinite(v) for v in norms) and all(math.isfinite(stats.activation_max[i]) for i in ran)
    expected = "finite, non-zero gradient norm in every block"
    observed = "grad norms " + ", ".join(f"{n:.2g}" for n in norms)
    if not finite:
        findings.append(
            Finding(
                "layer gradients",
                Status.FAILED,
                observed,
                expected,
                "non-finite gradients or activations in the blocks during training",
                "lower optimizer.lr or the init scale; look for log(0) or division by zero in the blocks",
            )
        )
    elif any(n == 0 for n in norms):
        zero = [names[i] for i, n in enumerate(norms) if n == 0]
        findings.append(
            Finding(
                "layer gradients",
                Status.FAILED,
                observed,
                expected,
                f"dead layer: {', '.join(zero)} get no gradient",
                "check the init and the connections of these blocks (check=preflight's gradient flow names the parameters)",
            )
        )
    elif max(norms) > 0 and min(norms) / max(norms) < ratio:
        low, high = min(range(len(norms)), key=norms.__getitem__), max(range(len(norms)), key=norms.__getitem__)
        findings.append(
            Finding(
                "layer gradients",
                Status.WARNING,
                observed,
                f"min/max block gradient norm >= {ratio:g}",
                f"gradients vanish or explode with depth: {names[low]} gets {norms[low] / norms[high]:.2g} of {names[high]}'s gradient norm "
                "(a norm can keep the activations looking healthy while the gradient through saturated or shrunk paths vanishes)",
                "check the residual connections (x + f(x)), saturating activations before norms, and the init scaling",
            )
        )
    else:
        findings.append(Finding("layer gradients", Status.PASSED, observed, expected))
    observed = "activation std " + ", ".join(f"{s:.2g}" for s in stds)
    if idle:
        observed += f"; never ran: {', '.join(idle)}"
    measured = [stds[i] for i in ran if math.isfinite(stds[i])]
    if finite and len(measured) >= 2 and measured[0] > 0 and measured[-1] / measured[0] > growth:
        findings.append(
            Finding(
                "layer activations",
                Status.WARNING,
                observed,
                f"last/first block std <= {growth:g}",
                "activations explode with depth",
                "scale residual writes down with depth (the default init does)",
            )
        )
    else:
        findings.append(Finding("layer activations", Status.PASSED if finite else Status.FAILED, observed, f"last/first block std <= {growth:g}"))
    worst = max(range(len(names)), key=lambda i: stats.dead_fraction[i])
    share = stats.dead_fraction[worst]
    observed = f"at most {share:.0%} dead inputs to linear layers ({names[worst]})"
    if share > dead_limit:
        findings.append(
            Finding(
                "dead units",
                Status.WARNING,
                observed,
                f"<= {dead_limit:.0%}",
                "units that are zero on every token (dead ReLUs, neurons that never spike)",
                "check the init, the thresholds, or lower the lr",
            )
        )
    else:
        findings.append(Finding("dead units", Status.PASSED, observed, f"<= {dead_limit:.0%}"))
    return findings


class Sanity(Stage):
    """Init loss vs chance, overfit one batch (gated), per-layer statistics. Thresholds: SanityConfig's fields."""

    name = "sanity"

    def __init__(
        self,
        init_batches: int = 4,
        batch_size: int = 8,
        init_tolerance: float = 0.5,
        overfit_sequences: int = 3,
        overfit_steps: int = 600,
        overfit_loss: float = 0.2,
        stats_steps: int = 5,
        vanishing_ratio: float = 1e-3,
        activation_growth: float = 100.0,
        dead_fraction: float = 0.5,
    ):
        self.init_batches, self.batch_size, self.init_tolerance = init_batches, batch_size, init_tolerance
        self.overfit_sequences, self.overfit_steps, self.overfit_loss = overfit_sequences, overfit_steps, overfit_loss
        self.stats_steps, self.vanishing_ratio = stats_steps, vanishing_ratio
        self.activation_growth, self.dead_fraction = activation_growth, dead_fraction
        self.step_fn: StepFn = train_step
        """The training step the probes run (tests put a broken one here)."""

    def cost(self, ctx: StageContext, costs) -> float:
        """The overfit's steps (it stops once the batch is learnt: planned at up to OVERFIT_PLAN of them), the statistics'
        steps and the init loss's forwards. The overfit is the gate: the budget never cuts it."""
        overfit = costs.steps(min(self.overfit_steps, OVERFIT_PLAN), sequences=self.overfit_sequences)
        return costs.build + overfit + costs.steps(self.stats_steps + self.init_batches * FORWARD_SHARE, sequences=self.batch_size)

    def assess(self, parts: Components, ctx: StageContext) -> StageResult:
        result = StageResult(self.name)
        result.findings.append(probe("init loss", lambda: init_loss(parts, self.batch_size, self.init_batches, self.init_tolerance)))
        curve = Curve()
        result.findings.append(
            probe("overfit one batch", lambda: overfit_one_batch(parts, self.step_fn, self.overfit_sequences, self.overfit_steps, self.overfit_loss, curve))
        )
        if curve.losses and ctx.state.is_main:  # one writer of the run folder
            result.figures.append(
                figures.overfit_curve(Path(ctx.run_dir) / "sanity_overfit.png", curve.losses, self.overfit_loss, chance_loss(num_classes(parts)))
            )
        names = [name for name, _ in _blocks(parts.model)]
        started = time.perf_counter()
        try:
            stats = gather_layer_stats(parts, self.step_fn, self.batch_size, self.stats_steps, ctx.loggers)
        except Exception as error:  # reported as a finding, like every probe
            result.findings.append(crash_finding("layer statistics", error))
            return result
        layers = layer_findings(stats, names, self.vanishing_ratio, self.activation_growth, self.dead_fraction)
        layers[0].seconds = time.perf_counter() - started  # the steps that gathered all three
        result.findings += layers
        explain_slow_overfit(result.findings, ctx.measured.get("alarms", {}))
        if ctx.state.is_main and names:
            result.figures.append(figures.layer_stats(Path(ctx.run_dir) / "sanity_layers.png", names, stats))
        result.details = stats_table(names, stats) if names else ""
        return result


SLOW = "the model learns, but too slowly to memorise one batch"
OVERFIT_PLAN = 250
"""Overfit steps the plan counts on: the slowest healthy model measured (spiking) memorised its batch in 222-253."""


def explain_slow_overfit(findings: list[Finding], earlier: dict[str, str]) -> None:
    """A batch learnt too slowly is often the symptom of a bug another probe names: gradients that vanish with
    depth (this stage's layer gradients), or parameters that train at a tiny lr (preflight's learning rates).
    Then the overfit failure is reported under that probe, which tells the causes apart."""
    overfit = next((f for f in findings if f.name == "overfit one batch" and f.status is Status.FAILED and f.cause.startswith(SLOW)), None)
    if overfit is None:
        return
    gradients = next((f for f in findings if f.name == "layer gradients" and f.status is Status.WARNING and "vanish" in f.cause), None)
    if gradients is not None:
        overfit.consequence_of = gradients.name
        overfit.cause = f"{SLOW}: a consequence of the gradients that vanish with depth (layer gradients: {gradients.observed})"
        overfit.fix = gradients.fix
    elif "learning rates" in earlier:
        overfit.consequence_of = "learning rates"
        overfit.cause = f"{SLOW}: a consequence of parameters that train at a tiny lr (preflight's learning rates: {earlier['learning rates']})"
        overfit.fix = "fix the per-group lr (see learning rates)"


def stats_table(names: list[str], stats: LayerStats) -> str:
    columns = ("activation mean", "activation std", "activation max abs", "grad norm", "grad mean", "grad std", "grad max abs", "update/weight")
    lines = ["| block | " + " | ".join(columns) + " | dead inputs |", "|---|" + "---:|" * (len(columns) + 1)]
    for i, name in enumerate(names):
        row = (stats.activation_mean[i], stats.activation_std[i], stats.activation_max[i], stats.grad_norm[i])
        row += (stats.grad_mean[i], stats.grad_std[i], stats.grad_max[i], stats.update_ratio[i])
        lines.append(f"| {name} | " + " | ".join(f"{value:.3g}" for value in row) + f" | {stats.dead_fraction[i]:.0%} |")
    return "\n".join(lines)
