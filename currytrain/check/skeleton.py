"""Stage skeleton: compose, build, one forward pass. Catches shape bugs, wrong vocab sizes and outputs that
are not logits before anything trains, and records parameter counts and where each component came from."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from currytrain.build import target_problem, targets
from currytrain.check.budget import FORWARD_SHARE
from currytrain.check.probes import chance_loss, eval_mode, expected_shapes, get_batch, input_vocab, num_classes
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status, probe
from currytrain.components import Components
from currytrain.model.protocol import HasLoss, data_ignore_index, find_blocks, hook


def parameter_counts(model: torch.nn.Module) -> list[tuple[str, int]]:
    """Parameters per top-level module, the repeated blocks (find_blocks) one by one (shared weights counted
    once, where first seen)."""
    seen: set[int] = set()
    rows = []
    named = find_blocks(model)
    tops = {name.split(".")[0] for name, _ in named}
    named += [(name, module) for name, module in model.named_children() if name not in tops]
    for name, module in named:
        count = 0
        for param in module.parameters():
            if id(param) not in seen:
                seen.add(id(param))
                count += param.numel()
        rows.append((name, count))
    return rows


def origins(cfg: DictConfig) -> list[tuple[str, str, str]]:
    """(config key, _target_, source file) of every component the config builds."""
    from hydra.utils import get_object

    rows = []
    allowed = cfg.build.allow if "build" in cfg else ()
    for key, target in targets(cfg):
        if (problem := target_problem(target, allowed)) is not None:  # never import what build() would not
            rows.append((key, target, f"? ({problem})"))
            continue
        try:
            source = inspect.getsourcefile(get_object(target)) or "?"
        except (TypeError, ImportError, AttributeError) as error:
            source = f"? ({error})"
        rows.append((key, target, _short_path(source)))
    return rows


def _short_path(source: str) -> str:
    path = Path(source)
    for root in (Path.cwd(), Path(torch.__file__).parents[1]):
        if path.is_relative_to(root):
            return str(path.relative_to(root))
    return source


def rows_finding(parts: Components, batch: tuple[torch.Tensor, torch.Tensor], batch_size: int) -> Finding:
    """A table's batch (data=digits|table): float feature rows and one class id each."""
    inputs, targets_ = batch
    classes = num_classes(parts)
    expected = f"inputs ({batch_size}, features) floating point, targets ({batch_size},) int64 in [0, {classes})"
    observed = (
        f"inputs {tuple(inputs.shape)} {inputs.dtype}, targets {tuple(targets_.shape)} {targets_.dtype} in [{int(targets_.min())}, {int(targets_.max())}]"
    )
    if inputs.dim() != 2 or inputs.shape[0] != batch_size or targets_.shape != (batch_size,) or targets_.dtype != torch.int64:
        return Finding(
            "batch shapes", Status.FAILED, observed, expected, "the data adapter's batch() returns other shapes or dtypes", "fix the adapter's batch()"
        )
    if int(targets_.max()) >= classes or int(targets_.min()) < 0:
        return Finding(
            "batch shapes", Status.FAILED, observed, expected, "class ids outside the model's outputs", f"pass model.num_classes={int(targets_.max()) + 1}"
        )
    return Finding("batch shapes", Status.PASSED, observed, expected)


def batch_finding(parts: Components, batch: tuple[torch.Tensor, torch.Tensor], batch_size: int) -> Finding:
    inputs, targets_ = batch
    if inputs.is_floating_point():  # rows of features, not token ids
        return rows_finding(parts, batch, batch_size)
    vocab, classes = input_vocab(parts, inputs), num_classes(parts)
    ignored = data_ignore_index(parts.data)
    input_shape, target_shape = expected_shapes(parts, batch_size)
    ids = f"ids in [0, {vocab})" if vocab else "ids >= 0"
    expected = f"inputs {input_shape} int64 with {ids}, targets {target_shape} int64 in [0, {classes}) or {ignored} (ignored)"
    observed = (
        f"inputs {tuple(inputs.shape)} {inputs.dtype} in [{int(inputs.min())}, {int(inputs.max())}], "
        f"targets {tuple(targets_.shape)} {targets_.dtype} in [{int(targets_.min())}, {int(targets_.max())}]"
    )
    shape_ok = tuple(inputs.shape) == input_shape and tuple(targets_.shape) == target_shape and inputs.dtype == targets_.dtype == torch.int64
    if not shape_ok:
        return Finding(
            "batch shapes",
            Status.FAILED,
            observed,
            expected,
            "the data adapter's batch() returns other shapes or dtypes than it declares (a language model's by default)",
            "fix the adapter's batch(); an adapter for another task declares expected_shapes(batch_size) and num_classes",
        )
    if (vocab and int(inputs.max()) >= vocab) or int(inputs.min()) < 0:
        return Finding(
            "batch shapes",
            Status.FAILED,
            observed,
            expected,
            f"token ids outside the model's vocabulary (its input embedding has {vocab} rows)",
            f"give the model a vocabulary of at least {int(inputs.max()) + 1} (model.vocab_size for curryTrain's families)",
        )
    scored = targets_[targets_ != ignored]  # positions the loss ignores (padding; probe tasks score answers only)
    if hook(parts.module, HasLoss) is None and hook(parts.data, HasLoss) is None and scored.numel() and (int(scored.max()) >= classes or int(scored.min()) < 0):
        # (a model or adapter with its own loss() decides which targets it scores: its ignore index may be any value)
        fix = f"give the model at least {int(scored.max()) + 1} output classes" if classes == vocab else "check the adapter's labels and num_classes"
        if int(scored.min()) < 0:
            fix = f"mark unscored targets with the adapter's ignore_index (now {ignored}), or give the model its own loss()"
        return Finding("batch shapes", Status.FAILED, observed, expected, f"targets outside the {classes} classes the model predicts", fix)
    return Finding("batch shapes", Status.PASSED, observed, expected)


def forward_finding(parts: Components, batch: tuple[torch.Tensor, torch.Tensor]) -> Finding:
    """The loss takes the cross-entropy of the logits' last dimension against targets of the leading shape."""
    inputs, targets_ = batch
    classes = num_classes(parts)
    expected = f"logits {(*targets_.shape, classes)} (the targets' shape x {classes} classes: chance ln C = {chance_loss(classes):.3f}), floating point, finite"
    with torch.no_grad(), eval_mode(parts.model):
        logits = parts.model(inputs)
    observed = f"{type(logits).__name__} {tuple(getattr(logits, 'shape', ()))} {getattr(logits, 'dtype', '')}"
    if not isinstance(logits, torch.Tensor) or logits.shape != (*targets_.shape, classes) or not logits.is_floating_point():
        return Finding(
            "forward shape",
            Status.FAILED,
            observed,
            expected,
            "the model's forward returns another shape than the targets' x classes",
            "return logits (..., classes) from forward: check the readout's size (model.vocab_size for curryTrain's families)",
        )
    if not torch.isfinite(logits).all():
        return Finding(
            "forward shape", Status.FAILED, observed + ", not finite", expected, "the forward pass overflows at init", "lower the init scale (model.init_std)"
        )
    return Finding("forward shape", Status.PASSED, observed, expected)


def logits_finding(parts: Components, inputs: torch.Tensor) -> Finding:
    """cross_entropy applies log_softmax itself: outputs that already are probabilities mean a double softmax."""
    with torch.no_grad(), eval_mode(parts.model):
        logits = parts.model(inputs).float()
    row_sums = logits.sum(-1)
    probabilities = bool((logits >= 0).all() and (logits <= 1).all() and torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-3))
    observed = f"min {logits.min():.3g}, max {logits.max():.3g}, rows sum to {row_sums.mean():.3g}"
    if probabilities:
        return Finding(
            "outputs are logits",
            Status.FAILED,
            observed,
            "unnormalised logits (the loss applies log_softmax itself)",
            "the model returns probabilities: a softmax before the cross-entropy (double softmax)",
            "return the raw logits from the model's forward/readout",
        )
    return Finding("outputs are logits", Status.PASSED, observed, "unnormalised logits")


class Skeleton(Stage):
    """Build every component, check one batch and one forward pass, record sizes and origins."""

    name = "skeleton"

    def __init__(self, batch_size: int = 2):
        self.batch_size = batch_size

    def cost(self, ctx: StageContext, costs) -> float:
        return costs.build + costs.steps(3 * FORWARD_SHARE, sequences=self.batch_size)

    def assess(self, parts: Components, ctx: StageContext) -> StageResult:
        batch = get_batch(parts, self.batch_size)
        result = StageResult(self.name)
        result.findings.append(probe("batch shapes", lambda: batch_finding(parts, batch, self.batch_size)))
        if result.status is Status.FAILED:  # a forward pass on ids outside the vocabulary would only crash
            return result
        result.findings.append(probe("forward shape", lambda: forward_finding(parts, batch)))
        result.findings.append(probe("outputs are logits", lambda: logits_finding(parts, batch[0])))
        result.details = details(parts, ctx.cfg)
        return result


def details(parts: Components, cfg: DictConfig) -> str:
    counts = parameter_counts(parts.model)
    total = sum(p.numel() for p in parts.model.parameters())
    lines = ["| module | parameters |", "|---|---:|", *(f"| {name} | {count:,} |" for name, count in counts), f"| **total** | **{total:,}** |", ""]
    lines += ["| config key | _target_ | source |", "|---|---|---|", *(f"| {key} | `{target}` | {source} |" for key, target, source in origins(cfg)), ""]
    lines.append(f"data: {_describe(parts.data)}")
    return "\n".join(lines)


def _describe(data: Any) -> str:
    return str(data.describe()) if hasattr(data, "describe") else type(data).__name__
