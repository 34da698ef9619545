"""Preflight probes. The step's wiring: does the optimizer hold every parameter, do gradients reach them, does zero_grad clear them, does one step lower the loss."""

import math

import torch

from currytrain.check.probes import StepFn, eval_loss, eval_mode, loss_of, peak_lr, scratch
from currytrain.check.stage import Finding, Status, fmt
from currytrain.components import Components
from currytrain.trainer.step import Batch


def _names(names: list[str], limit: int = 4) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def optimizer_coverage(parts: Components) -> Finding:
    """Every trainable parameter is in exactly one optimizer group."""
    counts: dict[int, int] = {}
    for group in parts.optimizer.param_groups:
        for param in group["params"]:
            counts[id(param)] = counts.get(id(param), 0) + 1
    trainable = [(name, p) for name, p in parts.model.named_parameters() if p.requires_grad]
    missing = [name for name, p in trainable if id(p) not in counts]
    twice = [name for name, p in trainable if counts.get(id(p), 0) > 1]
    observed = f"{len(trainable)} trainable, {len(missing)} missing from the optimizer, {len(twice)} in several groups"
    expected = "every trainable parameter in one optimizer group"
    if missing:
        return Finding(
            "optimizer coverage",
            Status.FAILED,
            f"{observed}: {_names(missing)}",
            expected,
            "parameters created after the optimizer, or left out of its groups",
            "build the optimizer from model.parameters() after the model is complete",
        )
    if twice:
        return Finding(
            "optimizer coverage",
            Status.FAILED,
            f"{observed}: {_names(twice)}",
            expected,
            "a parameter listed in two groups is stepped twice",
            "give each parameter one group (see currytrain/optim/builders.py)",
        )
    return Finding("optimizer coverage", Status.PASSED, observed, expected)


def frozen_parameters(parts: Components, allow_frozen: list[str]) -> Finding:
    frozen = [name for name, p in parts.model.named_parameters() if not p.requires_grad]
    unexpected = [name for name in frozen if not any(name.startswith(prefix) for prefix in allow_frozen)]
    expected = f"no frozen parameter outside check.stages.preflight.allow_frozen={list(allow_frozen)}"
    if unexpected:
        return Finding(
            "no frozen parameters",
            Status.FAILED,
            f"requires_grad=False: {_names(unexpected)}",
            expected,
            f"{_names(unexpected)} is frozen (requires_grad=False), so it never trains",
            "remove the requires_grad_(False), or list the prefix in check.stages.preflight.allow_frozen if it is frozen on purpose",
        )
    return Finding("no frozen parameters", Status.PASSED, f"{len(frozen)} frozen on purpose" if frozen else "none frozen", expected)


def gradient_flow(parts: Components, batch: Batch) -> Finding:
    """After one backward every trainable parameter has a gradient that is finite and not zero everywhere."""
    parts.optimizer.zero_grad(set_to_none=True)
    loss_of(parts, batch).backward()
    none, dead, bad = [], [], []
    for name, param in parts.model.named_parameters():
        if not param.requires_grad:
            continue
        if param.grad is None:
            none.append(name)
        elif not torch.isfinite(param.grad).all():
            bad.append(name)
        elif not param.grad.any():
            dead.append(name)
    parts.optimizer.zero_grad(set_to_none=True)
    observed = f"{len(none)} without gradient, {len(dead)} zero everywhere, {len(bad)} non-finite"
    expected = "a finite, non-zero gradient for every trainable parameter"
    if bad:
        return Finding(
            "gradient flow",
            Status.FAILED,
            f"{observed}: {_names(bad)}",
            expected,
            "the backward pass overflows",
            "lower model.init_std, or look for log(0)/division by zero in the forward",
        )
    if none:
        return Finding(
            "gradient flow",
            Status.FAILED,
            f"{observed}: {_names(none)}",
            expected,
            f"no gradient reaches {_names(none)}: a detached tensor (.detach(), .data, no_grad) or an unused module cuts the graph",
            "remove the detach, or delete the unused module",
        )
    if dead:
        return Finding(
            "gradient flow",
            Status.FAILED,
            f"{observed}: {_names(dead)}",
            expected,
            f"dead layer: {_names(dead)} get an all-zero gradient (zeroed weights, or a block whose output is multiplied by 0)",
            "check the init of these layers and what their output feeds",
        )
    return Finding("gradient flow", Status.PASSED, observed, expected)


def _captured_grads(parts: Components, step: StepFn, batch: Batch, seed: int) -> torch.Tensor | None:
    """The flattened gradients the optimizer sees in one step (None if it never stepped)."""
    seen: list[torch.Tensor] = []

    def capture(optimizer, args, kwargs):
        grads = [p.grad.detach().flatten() for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        seen.append(torch.cat(grads).clone() if grads else torch.zeros(0))

    handle = parts.optimizer.register_step_pre_hook(capture)
    try:
        torch.manual_seed(seed)  # same dropout masks in both steps
        step(parts, batch)
    finally:
        handle.remove()
    return seen[0] if seen else None


def zero_grad_between_steps(parts: Components, step: StepFn, batch: Batch, tolerance: float) -> Finding:
    """Two steps on the same batch at lr=0 (the weights do not move) must see identical gradients."""
    with scratch(parts, lr=0.0):
        first = _captured_grads(parts, step, batch, seed=1)
        second = _captured_grads(parts, step, batch, seed=1)
    expected = f"identical gradients in two identical steps (relative difference <= {tolerance:g})"
    if first is None or second is None:
        return Finding(
            "zero_grad between steps",
            Status.FAILED,
            "the optimizer never stepped",
            expected,
            "the step skipped the optimizer (non-finite gradients?)",
            "see the gradient flow probe",
        )
    ratio = float(second.norm() / first.norm().clamp_min(1e-30))
    relative = float((second - first).norm() / first.norm().clamp_min(1e-30))
    observed = f"second/first gradient norm {ratio:.3g}, relative difference {relative:.3g}"
    if relative > tolerance:
        cause = (
            "gradients accumulate across steps: optimizer.zero_grad() is missing" if abs(ratio - 2) < 0.05 else "the gradients of two identical steps differ"
        )
        return Finding(
            "zero_grad between steps",
            Status.FAILED,
            observed,
            expected,
            cause,
            "call optimizer.zero_grad(set_to_none=True) after every optimizer step (run_accumulated_step does)",
        )
    return Finding("zero_grad between steps", Status.PASSED, observed, expected)


def one_step_decreases_loss(parts: Components, step: StepFn, batch: Batch) -> Finding:
    """One step at the peak learning rate lowers the loss on the batch it trained on, and leaves outputs
    that still depend on the input (a far too large step can zero every prediction: a uniform loss)."""
    lr = peak_lr(parts)
    with scratch(parts, lr="peak"):
        before = eval_loss(parts, batch)
        torch.manual_seed(0)
        result = step(parts, batch)
        after = eval_loss(parts, batch)
        with torch.no_grad(), eval_mode(parts.model):
            spread = float(parts.model(batch[0]).float().std(-1).max())
    observed = f"loss {fmt(before)} -> {fmt(after)} after one step at lr={lr:g}"
    expected = "a lower loss, logits that still differ across the vocabulary"
    fix = f"lower optimizer.lr (try {lr / 10:g}), or check that the optimizer steps the model's own parameters"
    if result.skipped or not math.isfinite(after):
        return Finding(
            "one step lowers the loss",
            Status.FAILED,
            observed,
            expected,
            "the step produced non-finite gradients or weights",
            "lower optimizer.lr, set trainer.grad_clip=1.0",
        )
    if not spread > 1e-6:
        cause = f"the learning rate {lr:g} is far too high: one step wiped out the weights (every logit equal, a uniform prediction)"
        return Finding("one step lowers the loss", Status.FAILED, f"{observed}, logits constant", expected, cause, fix)
    if not after < before:
        cause = (
            f"the learning rate {lr:g} is too high: the step overshoots"
            if after > before * 1.05
            else "the update does not descend (sign of the update, or the optimizer holds other tensors than the model's)"
        )
        return Finding("one step lowers the loss", Status.FAILED, observed, expected, cause, fix)
    return Finding("one step lowers the loss", Status.PASSED, observed, expected)
