"""Preflight probes. The step's wiring: does the optimizer hold every parameter, do gradients reach them, does zero_grad clear them, does one step lower the loss."""

import math

import torch

from currytrain.check.probes import StepFn, eval_loss, eval_mode, loss_of, peak_lr, scratch, seeded
from currytrain.check.stage import Finding, Status, fmt
from currytrain.components import Components
from currytrain.model.protocol import HasMuP, HasParamGroups, hook
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
        own = hook(parts.module, HasParamGroups) is not None
        return Finding(
            "optimizer coverage",
            Status.FAILED,
            f"{observed}: {_names(missing)}",
            expected,
            f"{_names(missing)} never train: "
            + ("the model's param_groups() leaves them out" if own else "parameters created after the optimizer, or left out of its groups"),
            "return every trainable parameter from param_groups() (or freeze it with requires_grad_(False))"
            if own
            else "build the optimizer from model.parameters() after the model is complete",
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


GRADIENT_PASSES = 3
"""Seeded backward passes a parameter must miss its gradient in to count as cut off: a layer that stochastic depth
(LayerDrop) skips in one forward gets its gradient in another."""


def _gradient_pass(parts: Components, batch: Batch, seed: int) -> tuple[list[str], list[str], list[str]]:
    """(no gradient, zero everywhere, not finite): the trainable parameters of each kind after one seeded backward."""
    parts.optimizer.zero_grad(set_to_none=True)
    parts.model.zero_grad(set_to_none=True)
    with seeded(parts, seed):
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
    parts.model.zero_grad(set_to_none=True)
    return none, dead, bad


def gradient_flow(parts: Components, batch: Batch) -> Finding:
    """After a backward every trainable parameter has a gradient that is finite and not zero everywhere. A parameter
    without one is asked again on other seeds (GRADIENT_PASSES in all): only one that none of them reaches is cut off."""
    none, dead, bad = _gradient_pass(parts, batch, seed=0)
    for seed in range(1, GRADIENT_PASSES if none or dead else 1):
        again = _gradient_pass(parts, batch, seed)
        none = [name for name in none if name in again[0]]
        dead = [name for name in dead if name in again[0] + again[1]]
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


def _captured_grads(parts: Components, step: StepFn, batch: Batch, seed: int) -> dict[str, torch.Tensor] | None:
    """Every trainable parameter's flattened gradient as the optimizer step sees it (None if it never stepped)."""
    seen: list[dict[str, torch.Tensor]] = []
    named = [(name, p) for name, p in parts.model.named_parameters() if p.requires_grad]

    def capture(optimizer, args, kwargs):
        seen.append({name: p.grad.detach().flatten().clone() for name, p in named if p.grad is not None})

    handle = parts.optimizer.register_step_pre_hook(capture)
    try:
        torch.manual_seed(seed)  # same dropout masks in both steps
        step(parts, batch)
    finally:
        handle.remove()
    return seen[0] if seen else None


def _in_optimizer(parts: Components) -> set[int]:
    return {id(p) for group in parts.optimizer.param_groups for p in group["params"]}


def zero_grad_between_steps(parts: Components, step: StepFn, batch: Batch, tolerance: float) -> Finding:
    """Two steps on the same batch at lr=0 (the weights do not move) must see identical gradients. Parameters
    the optimizer does not hold keep their gradient through its zero_grad: that is the optimizer coverage
    probe's bug, reported under it."""
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
            consequence_of="gradient flow",
        )
    held = _in_optimizer(parts)
    params = dict(parts.model.named_parameters())
    names = [name for name in first if name in second]
    differing = [name for name in names if float((second[name] - first[name]).norm()) > tolerance * max(float(first[name].norm()), 1e-30)]
    own = [name for name in names if id(params[name]) in held]
    a = torch.cat([first[name] for name in own]) if own else torch.zeros(1)
    b = torch.cat([second[name] for name in own]) if own else torch.zeros(1)
    ratio = float(b.norm() / a.norm().clamp_min(1e-30))
    relative = float((b - a).norm() / a.norm().clamp_min(1e-30))
    observed = f"second/first gradient norm {ratio:.3g}, relative difference {relative:.3g} over the optimizer's parameters"
    outside = [name for name in differing if id(params[name]) not in held]
    if outside and not abs(ratio - 2) < 0.05:
        return Finding(
            "zero_grad between steps",
            Status.FAILED,
            f"{observed}; {_names(outside)}, outside the optimizer, accumulate",
            expected,
            f"a consequence of the optimizer coverage failure: zero_grad clears only the optimizer's parameters, so {_names(outside)} "
            "keep adding up gradients (and a gradient clip over all parameters then rescales the others step by step)",
            "give the optimizer every trainable parameter (see optimizer coverage)",
            consequence_of="optimizer coverage",
        )
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


def learning_rates(parts: Components, slow_ratio: float) -> Finding:
    """The peak lr each parameter group trains at: a group at lr 0 never trains; a group far below the fastest one
    learns that many times slower (muP's hidden matrices are expected to, by their width multiplier)."""
    mup = hook(parts.module, HasMuP)
    hidden = {id(p) for p in mup().params} if mup is not None else set()
    rows = []
    for group in parts.optimizer.param_groups:
        params = [p for p in group["params"] if p.requires_grad]
        if params:
            rows.append((float(group.get("initial_lr", group["lr"])), params, bool(hidden) and all(id(p) in hidden for p in params)))
    if not rows:
        return Finding(
            "learning rates", Status.FAILED, "no trainable parameter in the optimizer", "groups that train", "the optimizer is empty", "see optimizer coverage"
        )
    names = {id(p): name for name, p in parts.model.named_parameters()}
    top = max(lr for lr, _, _ in rows)
    observed = f"{len(rows)} groups at peak lr " + ", ".join(f"{lr:.3g}" for lr, _, _ in rows)
    expected = f"every group trains, none more than {slow_ratio:g}x slower than the fastest (muP's hidden matrices excepted)"
    still = [names.get(id(p), "?") for lr, params, _ in rows if lr == 0 for p in params]
    if still:
        return Finding(
            "learning rates",
            Status.FAILED,
            observed,
            expected,
            f"{_names(still)} sit in a group with lr 0: they never train",
            "give the group an lr (or freeze the parameters with requires_grad_(False) on purpose)",
        )
    slow = [(lr, params) for lr, params, is_mup in rows if not is_mup and lr * slow_ratio < top]
    if slow:
        lr, params = min(slow, key=lambda row: row[0])
        listed = [names.get(id(p), "?") for p in params]
        return Finding(
            "learning rates",
            Status.WARNING,
            observed,
            expected,
            f"{_names(listed)} train at lr {lr:.3g}, 1/{top / lr:.0f} of the fastest group's {top:.3g}: they learn that much slower",
            "check the per-group lr (or lr_scale) in the model's param_groups(); a deliberate slow group passes check.stages.preflight.slow_group_ratio",
        )
    return Finding("learning rates", Status.PASSED, observed, expected)


SMALLER_STEPS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
"""Fractions of the peak lr tried when one step at the peak lr does not lower the loss."""


def _one_step(parts: Components, step: StepFn, batch: Batch, scale: float) -> tuple[float, float, float, bool]:
    """(loss before, loss after one step at scale x the peak lr, the logits' spread after, whether it stepped)."""
    with scratch(parts, lr="peak", scale=scale):
        before = eval_loss(parts, batch)
        with seeded(parts, 0):
            result = step(parts, batch)
        after = eval_loss(parts, batch)
        with torch.no_grad(), eval_mode(parts.model), seeded(parts, 0):
            spread = float(parts.model(batch[0]).float().std(-1).max())
    return before, after, spread, not result.skipped


def one_step_decreases_loss(parts: Components, step: StepFn, batch: Batch) -> Finding:
    """One step at the peak learning rate lowers the loss on the batch it trained on, and leaves outputs
    that still depend on the input (a far too large step can zero every prediction: a uniform loss).

    When it does not, smaller steps tell the causes apart: one of them lowering the loss means the lr is too
    high (the advice is a measured lr, as check=lr_range would find); none lowering it means the update does not
    descend at any lr (its sign, or an optimizer that steps other tensors than the forward uses)."""
    lr = peak_lr(parts)
    before, after, spread, stepped = _one_step(parts, step, batch, 1.0)
    observed = f"loss {fmt(before)} -> {fmt(after)} after one step at lr={lr:g}"
    expected = "a lower loss, logits that still differ across the vocabulary"
    if stepped and math.isfinite(after) and after < before and spread > 1e-6:
        return Finding("one step lowers the loss", Status.PASSED, observed, expected)
    if not stepped or not math.isfinite(after):
        observed += " (non-finite gradients or weights)"
    elif not spread > 1e-6:
        observed += ", logits constant"
    tried = []
    for scale in SMALLER_STEPS:
        small_before, small_after, small_spread, small_stepped = _one_step(parts, step, batch, scale)
        tried.append(f"{fmt(small_after)} at lr={lr * scale:g}")
        if small_stepped and math.isfinite(small_after) and small_after < small_before and small_spread > 1e-6:
            return Finding(
                "one step lowers the loss",
                Status.FAILED,
                f"{observed}; after one step at smaller lrs: {', '.join(tried)}",
                expected,
                f"the learning rate {lr:g} is too high: one step at it does not lower the loss, one at {lr * scale:g} does",
                f"lower optimizer.lr to at most {lr * scale:g} (check=lr_range suggests one), or set trainer.grad_clip=1.0",
            )
    if not math.isfinite(before):
        cause = "the loss is not finite before any step: the forward overflows (init scale, log(0), division by zero)"
        fix = "see the gradient flow probe; lower the init scale (model.init_std)"
    else:
        cause = (
            f"the update does not descend at any lr (tried {lr:g} down to {lr * SMALLER_STEPS[-1]:g}): an update of the wrong sign "
            "(a negated loss or gradient: a gradient-reversal hook, maximize=True), or an optimizer that steps other tensors than the forward uses"
        )
        fix = "check the loss's sign, gradient hooks and the optimizer's parameters; a lower lr will not help"
    return Finding("one step lowers the loss", Status.FAILED, f"{observed}; after one step at smaller lrs: {', '.join(tried)}", expected, cause, fix)
