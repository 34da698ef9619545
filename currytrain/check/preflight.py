"""Stage preflight: cheap assertions about the training step, each a probe over the built Components.

optimizer coverage, frozen parameters, gradient flow, zero_grad between steps, train/eval mode, label
dependence and leakage, causality, train/val overlap and deterministic batches, one step lowers the loss.
Data that reports its own leakage checks (tables: data=digits|table, see currytrain.data.pipeline) gets
them as findings here; the probes of token streams (label leakage on random tokens, causality, overlap of
windows) run only when the inputs are token ids.
Every probe that trains does so inside `scratch`, so the next probe sees the model as built.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence

import torch

from currytrain.check.probes import StepFn, chance_loss, eval_loss, eval_mode, get_batch, loss_of, next_token_task, peak_lr, scratch, train_step
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status, crash_finding, fmt, probe
from currytrain.components import Components
from currytrain.data import HasLeakageReport
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


def _modes_during_step(parts: Components, step: StepFn, batch: Batch) -> list[str]:
    """Names of the modules that ran forward in eval mode during a training step."""
    in_eval: list[str] = []
    handles = [
        module.register_forward_pre_hook(lambda module, args, name=name: None if module.training else in_eval.append(name or "model"))
        for name, module in parts.model.named_modules()
    ]
    try:
        with scratch(parts):
            step(parts, batch)
    finally:
        for handle in handles:
            handle.remove()
    return list(dict.fromkeys(in_eval))


def _stochastic_modules(model: torch.nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0]


def train_eval_mode(parts: Components, step: StepFn, batch: Batch) -> Finding:
    """Training steps run in train mode; eval is deterministic; dropout-like modules are random in train mode."""
    in_eval = _modes_during_step(parts, step, batch)
    expected = "every module in train mode during a step; eval deterministic; dropout active in train"
    if in_eval:
        return Finding(
            "train/eval mode",
            Status.FAILED,
            f"{len(in_eval)} modules ran in eval mode during a training step: {_names(in_eval)}",
            expected,
            "the model is in eval mode during training (model.eval() without model.train() afterwards)",
            "call model.train() before training and after every evaluation",
        )
    inputs = batch[0]
    with torch.no_grad(), eval_mode(parts.model):
        torch.manual_seed(1)
        first = parts.model(inputs)
        torch.manual_seed(2)
        differs_in_eval = not torch.equal(first, parts.model(inputs))
    if differs_in_eval:
        return Finding(
            "train/eval mode",
            Status.FAILED,
            "two eval forward passes differ",
            expected,
            "randomness (dropout-like) stays active in eval mode",
            "gate the randomness on self.training",
        )
    stochastic = _stochastic_modules(parts.model)
    if not stochastic:
        return Finding("train/eval mode", Status.PASSED, "train mode during the step; eval deterministic; no dropout-like module", expected)
    with torch.no_grad():
        torch.manual_seed(1)
        first = parts.model(inputs)
        torch.manual_seed(2)
        same = torch.equal(first, parts.model(inputs))
    if same:
        return Finding(
            "train/eval mode",
            Status.FAILED,
            f"train-mode outputs identical despite {_names(stochastic)}",
            expected,
            "dropout is inactive in train mode",
            "check the modules' training flag",
        )
    return Finding(
        "train/eval mode", Status.PASSED, f"train mode during the step; eval deterministic; {len(stochastic)} dropout modules random in train", expected
    )


def label_dependence(parts: Components, batch: Batch) -> Finding:
    """The loss changes when the labels change (a loss against the inputs, or a constant, would not)."""
    generator = torch.Generator().manual_seed(0)
    random_targets = torch.randint(int(batch[1].max()) + 1, batch[1].shape, generator=generator).to(batch[1].device)
    true, random = eval_loss(parts, batch), eval_loss(parts, (batch[0], random_targets))
    observed = f"loss {true:.4f} with the labels, {random:.4f} with random labels"
    if true == random:
        return Finding(
            "loss depends on labels",
            Status.FAILED,
            observed,
            "different losses",
            "the loss ignores the targets",
            "compute the loss against the targets the data adapter returns",
        )
    return Finding("loss depends on labels", Status.PASSED, observed, "different losses")


def _random_token_data(data, vocab: int, seed: int = 0):
    """A copy of the data adapter cutting its batches from uniformly random tokens (same batch() code)."""
    randomised = copy.copy(data)
    generator = torch.Generator().manual_seed(seed)
    length = max(min(len(data.train), 200_000), data.seq_len + 2)  # plenty of windows, cheap to draw
    randomised.train = torch.randint(vocab, (length,), generator=generator, dtype=data.train.dtype)
    randomised.val = randomised.train
    return randomised


def label_leakage(parts: Components, step: StepFn, batch_size: int, steps: int, margin: float) -> Finding:
    """Trained on uniformly random tokens, no model can beat ln(V): a loss well below it means the inputs
    carry the labels (an off-by-one in the batching, or the target copied into the inputs)."""
    data = parts.data
    if not isinstance(getattr(data, "train", None), torch.Tensor):
        return Finding(
            "no label leakage",
            Status.WARNING,
            f"{type(data).__name__} has no token stream (.train)",
            "a stream to randomise",
            "the probe needs the adapter's tokens",
            "give the adapter a .train token tensor",
        )
    vocab = int(getattr(data, "vocab_size", parts.cfg.model.vocab_size))
    floor = chance_loss(vocab)
    randomised = dataclasses.replace(parts, data=_random_token_data(data, vocab))
    with scratch(parts, lr="peak"):
        losses = [step(randomised, get_batch(randomised, batch_size, step=index)).loss for index in range(steps)]
    last = sum(losses[-3:]) / len(losses[-3:])
    observed = f"loss {losses[0]:.3f} -> {last:.3f} after {steps} steps on random tokens"
    expected = f">= ln({vocab}) - {margin:g} = {floor - margin:.3f}"
    if last < floor - margin:
        return Finding(
            "no label leakage",
            Status.FAILED,
            observed,
            expected,
            "the model predicts random labels: the labels leak into the inputs (targets copied or not shifted)",
            "inputs must be tokens [t, t+T) and targets [t+1, t+T+1]: check the data adapter's batch()",
        )
    return Finding("no label leakage", Status.PASSED, observed, expected)


@torch.no_grad()
def causality(parts: Components, batch: Batch, tolerance: float) -> Finding:
    """Logits at positions <= t must not change when the tokens after t change (next-token tasks only)."""
    inputs = batch[0]
    if not next_token_task(batch):  # one label per sequence: the model may read the whole sequence
        shapes = f"targets {tuple(batch[1].shape)} for inputs {tuple(inputs.shape)}"
        return Finding("causality", Status.PASSED, f"not a next-token task ({shapes}): nothing to check", "causal logits for next-token targets")
    cut = inputs.shape[1] // 2
    changed = inputs.clone()
    changed[:, cut + 1 :] = (inputs[:, cut + 1 :] + 1 + torch.arange(inputs.shape[1] - cut - 1, device=inputs.device)) % int(parts.cfg.model.vocab_size)
    with eval_mode(parts.model):
        before = parts.model(inputs)[:, : cut + 1].float()
        after = parts.model(changed)[:, : cut + 1].float()
    change = float((after - before).abs().max() / before.abs().max().clamp_min(1e-12))
    observed = f"relative change {change:.3g} of the logits at positions <= {cut} when tokens > {cut} change"
    expected = f"<= {tolerance:g}"
    if not change <= tolerance:
        first = int(((after - before).abs().amax(dim=(0, 2)) > tolerance * before.abs().max()).nonzero()[0])
        return Finding(
            "causality",
            Status.FAILED,
            f"{observed} (first at position {first})",
            expected,
            "future tokens leak into earlier positions: the attention mask is not causal",
            "use a causal mask (is_causal=True) in every attention layer",
        )
    return Finding("causality", Status.PASSED, observed, expected)


def batch_determinism(parts: Components, batch_size: int) -> Finding:
    first, again, other = get_batch(parts, batch_size, step=1), get_batch(parts, batch_size, step=1), get_batch(parts, batch_size, step=2)
    same = torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    expected = "the same (step, microbatch) gives the same batch; other steps give other batches"
    if not same:
        return Finding(
            "deterministic batches",
            Status.FAILED,
            "two calls for step 1 differ",
            expected,
            "the batch function depends on hidden state (a global RNG, an iterator)",
            "derive each batch from (seed, split, step, microbatch, rank) only",
        )
    if torch.equal(first[0], other[0]):
        return Finding(
            "deterministic batches",
            Status.FAILED,
            "steps 1 and 2 give the same batch",
            expected,
            "the step is ignored: every step trains on one batch",
            "pass the step into the batch sampling",
        )
    return Finding("deterministic batches", Status.PASSED, "repeatable, and different per step", expected)


def train_val_overlap(parts: Components, windows: int, max_share: float) -> Finding:
    """Share of val windows (seq_len tokens) that occur verbatim in the train stream."""
    data = parts.data
    if not isinstance(getattr(data, "train", None), torch.Tensor) or not isinstance(getattr(data, "val", None), torch.Tensor):
        return Finding(
            "no train/val overlap",
            Status.WARNING,
            f"{type(data).__name__} has no train/val token streams",
            "streams to compare",
            "the probe needs .train and .val tensors",
            "give the adapter .train and .val token tensors",
        )
    train = data.train.cpu().numpy().tobytes()
    val_windows = data.batch("val", 0, 0, windows)[0]
    found = sum(train.find(row.to(data.train.dtype).numpy().tobytes()) >= 0 for row in val_windows)
    share = found / windows
    observed = f"{found} of {windows} val windows ({data.seq_len} tokens) occur in the train stream"
    expected = f"share <= {max_share:g}"
    if share > max_share:
        return Finding(
            "no train/val overlap",
            Status.FAILED,
            observed,
            expected,
            "the val split repeats the train data (the same files in both, or no split at all)",
            "split by file before any processing, and deduplicate the corpus",
        )
    status = Status.WARNING if found else Status.PASSED
    cause = "some val text is duplicated in train (boilerplate shared across files)" if found else ""
    return Finding("no train/val overlap", status, observed, expected, cause, "deduplicate the corpus" if found else "")


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


def split_leakage(parts: Components, thresholds: dict) -> list[Finding]:
    """The data's own leakage checks (currytrain.data.pipeline.leakage_report), one finding each."""
    try:
        leaks = parts.data.leakage_report(**thresholds)
    except Exception as error:  # a crash is itself the finding, as in probe()
        return [crash_finding("split leakage", error)]
    return [Finding(leak.check, Status.FAILED if leak.leaked else Status.PASSED, leak.observed, leak.expected, leak.cause, leak.fix) for leak in leaks]


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
        near_distance: float = 0.05,
        max_duplicate_share: float = 0.0,
        target_threshold: float = 0.99,
    ):
        self.batch_size, self.allow_frozen = batch_size, list(allow_frozen)
        self.grad_tolerance, self.causal_tolerance = grad_tolerance, causal_tolerance
        self.leak_steps, self.leak_margin = leak_steps, leak_margin
        self.overlap_windows, self.max_overlap = overlap_windows, max_overlap
        self.leak_thresholds = {"near_distance": near_distance, "max_duplicate_share": max_duplicate_share, "target_threshold": target_threshold}
        self.step_fn: StepFn = train_step
        """The training step the probes run (tests put a broken one here)."""

    def assess(self, parts: Components, ctx: StageContext) -> StageResult:
        batch, step = get_batch(parts, self.batch_size), self.step_fn
        probes = {
            "optimizer coverage": lambda: optimizer_coverage(parts),
            "no frozen parameters": lambda: frozen_parameters(parts, self.allow_frozen),
            "gradient flow": lambda: gradient_flow(parts, batch),
            "zero_grad between steps": lambda: zero_grad_between_steps(parts, step, batch, self.grad_tolerance),
            "train/eval mode": lambda: train_eval_mode(parts, step, batch),
            "loss depends on labels": lambda: label_dependence(parts, batch),
            "no label leakage": lambda: label_leakage(parts, step, self.batch_size, self.leak_steps, self.leak_margin),
            "causality": lambda: causality(parts, batch, self.causal_tolerance),
            "deterministic batches": lambda: batch_determinism(parts, self.batch_size),
            "no train/val overlap": lambda: train_val_overlap(parts, self.overlap_windows, self.max_overlap),
            "one step lowers the loss": lambda: one_step_decreases_loss(parts, step, batch),
        }
        if batch[0].is_floating_point():  # rows of features, not token ids: nothing to shift, mask or randomise
            for name in ("no label leakage", "causality", "no train/val overlap"):
                del probes[name]
        findings = [probe(name, run) for name, run in probes.items()]
        if isinstance(parts.data, HasLeakageReport):
            findings += split_leakage(parts, self.leak_thresholds)
        return StageResult(self.name, findings)
