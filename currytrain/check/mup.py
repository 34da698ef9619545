"""Stage mup: the coordinate check of muP (Tensor Programs V, Yang et al. 2022).

The configured model is built at several widths (model.dim, with the hidden sizes scaled alike; everything
else as configured) and trained a few Adam steps at a constant lr on one fixed batch. Per layer type it
measures, at every width: the RMS of the outputs after training (activations), the RMS of their change
since init (the update's effect), and the RMS of the weights' gradient at init. Under a working muP the
activations and their updates keep their size as width grows; under the standard parameterisation Adam's
updates add up over fan-in and they grow with width. Gate: each activation and update quantity spreads
(max/min over widths) by at most `tolerance`. Gradients are reported, not gated: their entries shrink
with fan-in under both parameterisations.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from omegaconf import DictConfig

from currytrain.build import build
from currytrain.check import figures
from currytrain.check.probes import get_batch
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status, probe
from currytrain.check.subruns import model_at_width, width_skipped
from currytrain.components import Components
from currytrain.model import build_model
from currytrain.model.protocol import LossFn, find_blocks, task_loss, token_loss_sum


def layer_types(model: torch.nn.Module) -> dict[str, list[torch.nn.Module]]:
    """Modules whose outputs are measured, by type: the embedding, each kind of block sublayer (by its
    attribute name in the repeated blocks, find_blocks: attention, mlp, moe, ...; norms, whose parameters are
    all gains, left out), and the readout."""
    types: dict[str, list[torch.nn.Module]] = {}
    embedding = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
    if embedding is not None:
        types["embedding"] = [embedding]
    for _, block in find_blocks(model):
        for name, child in block.named_children():
            params = list(child.parameters())
            if params and any(p.dim() >= 2 for p in params):
                types.setdefault(name, []).append(child)
    return types


def _first_tensor(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else next(t for t in out if isinstance(t, torch.Tensor))


def capture(model: torch.nn.Module, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every measured module's output (concatenated per type) and the logits, in eval mode."""
    outputs: dict[str, list[torch.Tensor]] = {}
    handles = []
    for name, modules in layer_types(model).items():
        for module in modules:
            hook = lambda module, args, out, name=name: outputs.setdefault(name, []).append(_first_tensor(out).detach().float().flatten())  # noqa: E731
            handles.append(module.register_forward_hook(hook))
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(inputs).float()
    finally:
        model.train(training)
        for handle in handles:
            handle.remove()
    captured = {name: torch.cat(values) for name, values in outputs.items()}
    captured["logits"] = logits.flatten()
    return captured


def rms(x: torch.Tensor) -> float:
    return float(x.pow(2).mean().sqrt())


def grad_scales(model: torch.nn.Module) -> dict[str, float]:
    """RMS gradient entry of the matrices of each layer type."""
    scales = {}
    for name, modules in layer_types(model).items():
        grads = [p.grad.flatten() for m in modules for p in m.parameters() if p.grad is not None and p.dim() >= 2]
        if grads:
            scales[name] = rms(torch.cat(grads))
    return scales


def measure(
    cfg: DictConfig, width: int, batch: tuple[torch.Tensor, torch.Tensor], steps: int, lr: float | None, loss_fn: LossFn = token_loss_sum
) -> dict[str, float]:
    """Train the model at `width` `steps` Adam steps on `batch`; its activation, update and gradient scales."""
    torch.manual_seed(cfg.seed)
    model = build_model(model_at_width(cfg.model, width)).to(batch[0].device)
    score = task_loss(model, loss_fn)
    optimizer = build(cfg.optimizer, exclude=["schedule"], model=model)
    if lr is not None:  # a constant lr, every group keeping its (muP) ratio to the base lr
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * lr / cfg.optimizer.lr
    inputs, targets = batch
    before = capture(model, inputs)
    gradients: dict[str, float] = {}
    for index in range(steps):
        score(model(inputs), (inputs, targets)).mean.backward()
        if index == 0:
            gradients = grad_scales(model)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    after = capture(model, inputs)
    scales = {f"{name} activation": rms(after[name]) for name in after}
    scales |= {f"{name} update": rms(after[name] - before[name]) for name in after}
    scales |= {f"{name} gradient": value for name, value in gradients.items()}
    return scales


def spread(values: list[float]) -> float:
    """max/min over widths (inf when a value is zero or not finite)."""
    if not all(math.isfinite(v) and v > 0 for v in values):
        return math.inf
    return max(values) / min(values)


def slope(widths: list[int], values: list[float]) -> float:
    """Least-squares exponent b of value ~ width^b."""
    if not all(v > 0 and math.isfinite(v) for v in values):
        return math.nan
    xs, ys = [math.log(w) for w in widths], [math.log(v) for v in values]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)


def coordinate_finding(widths: list[int], table: dict[str, list[float]], tolerance: float, mup: bool, standard_fails: bool = True) -> Finding:
    gated = {name: values for name, values in table.items() if not name.endswith("gradient")}
    spreads = {name: spread(values) for name, values in gated.items()}
    worst = max(spreads, key=spreads.get)
    observed = f"worst: {worst} x{spreads[worst]:.3g} from width {widths[0]} to {widths[-1]} (width^{slope(widths, gated[worst]):.2f})"
    expected = f"every activation and update within x{tolerance:g} across widths {widths}"
    if spreads[worst] <= tolerance:
        return Finding("coordinate check", Status.PASSED, observed, expected)
    grown = sorted(name for name, value in spreads.items() if value > tolerance)
    if mup:
        cause = f"with model.mup=true these still change with width: {', '.join(grown)}; a layer misses its muP init, lr or multiplier"
        fix = "check the family's hidden_matrices(), the readout multiplier and the optimizer's muP param groups (tests/test_mup.py)"
    else:
        cause = f"the standard parameterisation: {', '.join(grown)} change with width, so hyperparameters tuned at one width do not transfer"
        fix = "pass model.mup=true model.mup_base_width=<the width you tune at> (optimizer=adamw)"
    status = Status.FAILED if mup or standard_fails else Status.WARNING
    return Finding("coordinate check", status, observed, expected, cause, fix)


class MupCheck(Stage):
    """Activation, update and gradient scales per layer type against width. Thresholds: MupCheckConfig's fields."""

    name = "mup"

    def __init__(
        self,
        widths: list[int] = (64, 128, 256),
        steps: int = 5,
        batch_size: int = 8,
        lr: float | None = None,
        tolerance: float = 2.0,
        standard_fails: bool = True,
    ):
        self.widths, self.steps, self.batch_size, self.lr, self.tolerance = sorted(widths), steps, batch_size, lr, tolerance
        self.standard_fails = standard_fails
        self.table: dict[str, list[float]] = {}
        """Quantity -> its scale at each width (tests and the report read it)."""

    def cost(self, ctx: StageContext, costs) -> float:
        """A build; with a gate to check, a model built and trained `steps` steps at every width (parameters ~ width^2)."""
        if "dim" not in ctx.cfg.model or (not ctx.cfg.model.get("mup", False) and not self.standard_fails):
            return costs.build
        dim = int(ctx.cfg.model.dim)
        widths = [costs.build + costs.steps(self.steps, sequences=self.batch_size, params=int(costs.params * (w / dim) ** 2)) for w in self.widths]
        return costs.build + sum(widths)

    def assess(self, parts: Components, ctx: StageContext) -> StageResult:
        result = StageResult(self.name)
        if "dim" not in ctx.cfg.model:
            result.findings.append(width_skipped("coordinate check"))
            return result
        mup = bool(ctx.cfg.model.get("mup", False))
        if not mup and not self.standard_fails:
            note = "model.mup=false: the standard parameterisation is not width-invariant by design, so there is nothing to gate"
            result.findings.append(Finding("coordinate check", Status.SKIPPED, note, "a muP model (model.mup=true)", "", "check=mup measures it"))
            return result
        batch = get_batch(parts, self.batch_size)

        def check() -> Finding:
            per_width = [measure(ctx.cfg, width, batch, self.steps, self.lr, parts.loss_fn) for width in self.widths]
            self.table = {name: [scales.get(name, math.nan) for scales in per_width] for name in per_width[0]}
            return coordinate_finding(self.widths, self.table, self.tolerance, mup, self.standard_fails)

        result.findings.append(probe("coordinate check", check))
        if not self.table:
            return result
        if ctx.state.is_main:
            run_dir = Path(ctx.run_dir)
            title = f"coordinate check (model.mup={str(mup).lower()}, {self.steps} steps)"
            activations = {k: v for k, v in self.table.items() if not k.endswith("gradient")}
            result.figures.append(figures.width_scales(run_dir / "mup_coordinates.png", self.widths, activations, title))
        result.details = scale_table(self.widths, self.table)
        return result


def scale_table(widths: list[int], table: dict[str, list[float]]) -> str:
    lines = ["| quantity | " + " | ".join(f"width {w}" for w in widths) + " | max/min | exponent |", "|---|" + "---:|" * (len(widths) + 2)]
    for name, values in table.items():
        cells = " | ".join(f"{v:.3g}" for v in values)
        lines.append(f"| {name} | {cells} | {spread(values):.3g} | {slope(widths, values):.2f} |")
    return "\n".join(lines)
