"""Preflight probes. The model's modes and masks: train/eval switching during the step, and causality of the attention."""

import torch

from currytrain.check.preflight.wiring import _names
from currytrain.check.probes import StepFn, eval_mode, next_token_task, scratch
from currytrain.check.stage import Finding, Status
from currytrain.components import Components
from currytrain.trainer.step import Batch


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
