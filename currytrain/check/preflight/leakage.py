"""Preflight probes. The data's honesty: does the loss depend on the labels, can the labels leak into the inputs, are batches deterministic, do train and val overlap."""

import copy
import dataclasses

import torch

from currytrain.check.probes import StepFn, chance_loss, data_vocab, eval_loss, eval_mode, get_batch, scratch, seeded
from currytrain.check.stage import Finding, Status, crash_finding
from currytrain.components import Components
from currytrain.model.protocol import data_ignore_index
from currytrain.trainer.step import Batch


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


def loss_sign(parts: Components, batch: Batch) -> Finding:
    """A task loss of the cross-entropy kind is never negative: a negative one has the wrong sign (a log-likelihood
    returned without its minus), and training then maximises the error while the reported loss falls."""
    value = eval_loss(parts, batch)
    observed, expected = f"loss {value:.4f} at init", ">= 0 (a cross-entropy)"
    if value < 0:
        return Finding(
            "loss sign",
            Status.FAILED,
            observed,
            expected,
            "a negative loss: the loss has the wrong sign (a log-likelihood returned without its minus), so training maximises the error",
            "return the negative log-likelihood (F.cross_entropy) from the model's loss()",
        )
    return Finding("loss sign", Status.PASSED, observed, expected)


def _random_token_data(data, vocab: int, seed: int = 0):
    """A copy of the data adapter cutting its batches from uniformly random tokens (same batch() code)."""
    randomised = copy.copy(data)
    generator = torch.Generator().manual_seed(seed)
    length = max(min(len(data.train), 200_000), data.seq_len + 2)  # plenty of windows, cheap to draw
    randomised.train = torch.randint(vocab, (length,), generator=generator, dtype=data.train.dtype)
    randomised.val = randomised.train
    return randomised


def filler_target(targets: torch.Tensor, vocab: int, ignored: int) -> tuple[int, float] | None:
    """(id, share) of a target id that the adapter writes itself (padding, a fill value): on uniformly random
    tokens every id is a target about 1/V of the time; one far more often than that (5/V and at least 5%) was not
    drawn from the stream. None when there is none (ids the loss ignores do not count)."""
    scored = targets[targets != ignored].flatten()
    if scored.numel() == 0:
        return None
    values, counts = torch.unique(scored, return_counts=True)
    top = int(counts.argmax())
    share = float(counts[top]) / targets.numel()
    return (int(values[top]), share) if share >= max(5.0 / vocab, 0.05) else None


@torch.no_grad()
def counts_in_loss(parts: Components, batch: Batch, target: int) -> bool:
    """Whether the task loss scores the positions whose target is `target`: changing the logits there alone
    changes it (the model's own loss decides, with its own ignore index)."""
    inputs, targets = batch
    mask = targets == target
    with eval_mode(parts.model), seeded(parts):
        logits = parts.model(inputs).float()
    moved = logits.clone()
    moved[mask] = moved[mask] + torch.linspace(-3.0, 3.0, logits.shape[-1], device=logits.device)
    return float(parts.score(moved, batch)) != float(parts.score(logits, batch))


def label_leakage(parts: Components, step: StepFn, batch_size: int, steps: int, margin: float) -> Finding:
    """Trained on uniformly random tokens, no model can beat ln(V): a loss well below it means the inputs
    carry the labels (an off-by-one in the batching, or the target copied into the inputs), or that the loss
    scores targets the adapter wrote itself (padding counted in the loss): the two are told apart by the targets."""
    data = parts.data
    if not isinstance(getattr(data, "train", None), torch.Tensor):
        return Finding(
            "no label leakage",
            Status.SKIPPED,
            f"{type(data).__name__} has no token stream (.train) to randomise",
            "a stream to randomise",
            "",
            "give the adapter a .train token tensor to have its batches checked for leaked labels",
        )
    vocab = data_vocab(parts)
    floor = chance_loss(vocab)
    randomised = dataclasses.replace(parts, data=_random_token_data(data, vocab))
    batches = [get_batch(randomised, batch_size, step=index) for index in range(steps)]
    with scratch(parts, lr="peak"):
        losses = [step(randomised, batch).loss for batch in batches]
    last = sum(losses[-3:]) / len(losses[-3:])
    observed = f"loss {losses[0]:.3f} -> {last:.3f} after {steps} steps on random tokens"
    expected = f">= ln({vocab}) - {margin:g} = {floor - margin:.3f}"
    if losses[0] < 0:  # a loss of the wrong sign falls without bound: nothing to read here
        return Finding(
            "no label leakage",
            Status.FAILED,
            observed,
            expected,
            "a consequence of the negative loss (see loss sign)",
            "fix the loss's sign",
            consequence_of="loss sign",
        )
    filler = filler_target(torch.cat([b[1].flatten() for b in batches]), vocab, data_ignore_index(data))
    if filler is not None:
        observed += f"; the adapter writes target {filler[0]} at {filler[1]:.0%} of the positions"
    counted = filler is not None and counts_in_loss(parts, batches[-1], filler[0])
    if not last < floor - margin and not counted:
        return Finding("no label leakage", Status.PASSED, observed, expected)
    if counted:
        return Finding(
            "no label leakage",
            Status.FAILED if last < floor - margin else Status.WARNING,
            observed,
            expected,
            f"padding counted in the loss: the adapter fills {filler[1]:.0%} of the targets with id {filler[0]}, which the loss scores "
            "(a constant target is easy), so the loss falls even on random tokens and every loss the run reports is diluted",
            f"mark padded targets with the adapter's ignore_index (the default loss ignores it), or ignore id {filler[0]} in the model's own loss()",
        )
    return Finding(
        "no label leakage",
        Status.FAILED,
        observed,
        expected,
        "the model predicts random labels: the labels leak into the inputs (targets copied or not shifted)",
        "inputs must be tokens [t, t+T) and targets [t+1, t+T+1]: check the data adapter's batch()",
    )


@torch.no_grad()
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


def in_memory_streams(split: object) -> list[torch.Tensor]:
    """The token tensors of a split: the split itself, or each source of a mixture (data.sources); none when any is
    read through memory maps (a split above data=tokens' in-memory size)."""
    streams = [split] if isinstance(split, torch.Tensor) else list(getattr(split, "streams", None) or [])
    return streams if streams and all(isinstance(stream, torch.Tensor) for stream in streams) else []


def train_val_overlap(parts: Components, windows: int, max_share: float, warn_share: float = 0.05) -> Finding:
    """Share of val windows (seq_len tokens) that occur verbatim in the train stream: above max_share fails (val
    repeats train), above warn_share warns; a few (boilerplate a corpus shares across files) are reported only."""
    data = parts.data
    trains, vals = in_memory_streams(getattr(data, "train", None)), in_memory_streams(getattr(data, "val", None))
    if not trains or not vals:
        return Finding(
            "no train/val overlap",
            Status.SKIPPED,
            f"{type(data).__name__} has no train/val token streams to compare",
            "streams to compare",
            "",
            "give the adapter .train and .val token tensors to have its splits compared",
        )
    train = [(stream.cpu().numpy().tobytes(), stream.dtype) for stream in trains]
    val_windows = data.batch("val", 0, 0, windows)[0]
    found = sum(any(text.find(row.to(dtype).numpy().tobytes()) >= 0 for text, dtype in train) for row in val_windows)
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
    if share > warn_share:
        cause = f"more than {warn_share:.0%} of the val windows are duplicated in train: shared files, or boilerplate"
        return Finding("no train/val overlap", Status.WARNING, observed, f"share <= {warn_share:g}", cause, "deduplicate the corpus")
    return Finding("no train/val overlap", Status.PASSED, observed + (" (shared boilerplate)" if found else ""), expected)


def split_leakage(parts: Components, thresholds: dict) -> list[Finding]:
    """The data's own leakage checks (currytrain.data.pipeline.leakage_report), one finding each."""
    try:
        leaks = parts.data.leakage_report(**thresholds)
    except Exception as error:  # a crash is itself the finding, as in probe()
        return [crash_finding("split leakage", error)]
    return [Finding(leak.check, Status.FAILED if leak.leaked else Status.PASSED, leak.observed, leak.expected, leak.cause, leak.fix) for leak in leaks]
