"""Preflight probes. The model's modes and masks: train/eval switching during the step, and causality of the attention."""

import torch

from currytrain.check.preflight.wiring import _names
from currytrain.check.probes import StepFn, data_vocab, eval_mode, input_vocab, next_token_task, scratch, seeded
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
        with seeded(parts, 1):
            first = parts.model(inputs)
        with seeded(parts, 2):
            differs_in_eval = not torch.equal(first, parts.model(inputs))
    if differs_in_eval:
        return Finding(
            "train/eval mode",
            Status.FAILED,
            "two eval forward passes of the same weights and inputs differ",
            expected,
            "randomness (dropout-like) stays active in eval mode: a dropout called with training=True, or a random draw not gated on self.training",
            "gate the randomness on self.training (F.dropout(x, p, training=self.training), or an nn.Dropout module)",
        )
    stochastic = _stochastic_modules(parts.model)
    if not stochastic:
        return Finding("train/eval mode", Status.PASSED, "train mode during the step; eval deterministic; no dropout-like module", expected)
    with torch.no_grad():
        with seeded(parts, 1):
            first = parts.model(inputs)
        with seeded(parts, 2):
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
    """Logits at positions <= t must not change when the tokens after t change (next-token tasks only).

    Every forward runs on the same seeded RNG, so dropout left on in eval draws the same masks in each; and the
    change is weighed against the variation of two identical forwards, so randomness the seed does not control
    is not read as a leak of the future."""
    inputs = batch[0]
    if not next_token_task(batch):  # one label per sequence: the model may read the whole sequence
        shapes = f"targets {tuple(batch[1].shape)} for inputs {tuple(inputs.shape)}"
        return Finding("causality", Status.SKIPPED, f"not a next-token task ({shapes}): nothing to check", "causal logits for next-token targets")
    vocab = min(v for v in (input_vocab(parts, inputs), data_vocab(parts), int(inputs.max()) + 2) if v)
    cut = inputs.shape[1] // 2
    changed = inputs.clone()
    changed[:, cut + 1 :] = (inputs[:, cut + 1 :] + 1 + torch.arange(inputs.shape[1] - cut - 1, device=inputs.device)) % vocab
    with torch.no_grad(), eval_mode(parts.model):
        with seeded(parts, 1):
            before = parts.model(inputs)[:, : cut + 1].float()
        with seeded(parts, 1):
            again = parts.model(inputs)[:, : cut + 1].float()
        with seeded(parts, 1):
            after = parts.model(changed)[:, : cut + 1].float()
    scale = before.abs().max().clamp_min(1e-12)
    change, floor = float((after - before).abs().max() / scale), float((again - before).abs().max() / scale)
    observed = f"relative change {change:.3g} of the logits at positions <= {cut} when tokens > {cut} change (identical forwards: {floor:.3g})"
    expected = f"<= {tolerance:g}, and no more than identical forwards vary"
    if change <= tolerance:
        return Finding("causality", Status.PASSED, observed, expected)
    if change <= 3 * floor:
        return Finding(
            "causality",
            Status.WARNING,
            observed,
            expected,
            "two identical eval forwards on the same seed differ by as much as the change: randomness the RNG seed does not "
            "control hides any leak of the future below that level",
            "make eval deterministic (see the train/eval mode probe), then rerun check=preflight",
            consequence_of="train/eval mode",
        )
    first = int(((after - before).abs().amax(dim=(0, 2)) > max(tolerance, 3 * floor) * scale).nonzero()[0])
    return Finding(
        "causality",
        Status.FAILED,
        f"{observed} (first at position {first})",
        expected,
        "future tokens leak into earlier positions: the attention mask is not causal",
        "use a causal mask (is_causal=True) in every attention layer",
    )
