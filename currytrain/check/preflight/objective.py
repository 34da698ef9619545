"""Preflight probes. What the loss is asked to learn: does it score each position against the next token, does it score
every token the text holds, and do the ranks and microbatches of a step see different data."""

import torch

from currytrain.check.probes import eval_mode, next_token_task, seeded
from currytrain.check.stage import Finding, Status, fmt
from currytrain.components import Components
from currytrain.model.protocol import data_ignore_index
from currytrain.trainer.step import Batch

ALIGNMENTS = {"target": "the next token", "next target": "the token after the next", "input": "its own input token"}
"""What position t may be scored against: the adapter's target at t (the next token, a language model's), the target at
t + 1 (the token after the next), or the input at t."""

CONFIDENT = 30.0
"""The logit given to the one token a probe's logits predict (its softmax is then all but one-hot)."""


def _predicting(tokens: torch.Tensor, vocab: int, ignored: int) -> torch.Tensor:
    """Logits that predict tokens[:, t] at every position t < T - 1 (uniform at the last position, where the target of
    t + 1 does not exist, and where a token is an ignore index), so that every alignment is scored on the same positions."""
    batch, length = tokens.shape
    logits = torch.zeros(batch, length, vocab, device=tokens.device)
    span = tokens[:, : length - 1]
    valid = (span >= 0) & (span < vocab) & (span != ignored)
    hot = torch.zeros(batch, length - 1, vocab, device=tokens.device)
    hot.scatter_(-1, span.clamp(0, vocab - 1)[..., None], CONFIDENT)
    logits[:, : length - 1] = hot * valid[..., None]
    return logits


@torch.no_grad()
def loss_alignment(parts: Components, batch: Batch) -> Finding:
    """Which token the task loss scores each position against, read from the loss itself: logits that predict the
    adapter's target, the target one position later, or the position's own input token are scored by the run's loss
    (the model's own loss() when it has one); the target must score best. Catches a loss that shifts targets that are
    already shifted (predicting t + 2), and one that scores a position against its own input (no shift: the model
    learns to copy). Data whose targets are its inputs is the label probes' to name, and a loss below zero the loss
    sign probe's: this probe skips them."""
    inputs, targets = batch
    name, expected = "loss scores the next token", "logits predicting the adapter's targets (the next tokens) score lowest"
    if not next_token_task(batch) or inputs.shape[1] < 3 or inputs.is_floating_point():
        return Finding(name, Status.SKIPPED, f"not a next-token task over token ids (inputs {tuple(inputs.shape)})", expected)
    ignored = data_ignore_index(parts.data)
    kept = targets != ignored
    if kept.any() and float((targets[kept] == inputs[kept]).float().mean()) > 0.5:
        return Finding(name, Status.SKIPPED, "the targets equal the inputs at most positions: see the label probes", expected)
    with eval_mode(parts.model), seeded(parts):
        vocab = int(parts.model(inputs[:1]).shape[-1])
    shifted = torch.cat([targets[:, 1:], targets[:, -1:]], dim=1)
    tokens = {"target": targets, "next target": shifted, "input": inputs}
    scores = {key: float(parts.score(_predicting(value, vocab, ignored), batch)) for key, value in tokens.items()}
    uniform = float(parts.score(torch.zeros(*inputs.shape, vocab, device=inputs.device), batch))
    observed = (
        f"loss {fmt(scores['target'])} for logits predicting the targets, {fmt(scores['next target'])} the token after, "
        f"{fmt(scores['input'])} the inputs; {fmt(uniform)} for uniform logits"
    )
    best = min(scores, key=scores.get)
    gain = uniform - scores[best]
    if uniform < 0 or not gain > 0.5:
        return Finding(
            name,
            Status.SKIPPED,
            observed + ": the loss falls for none of them (see loss sign)",
            expected,
            "",
            "a loss other than a cross-entropy over the logits",
        )
    others = min(value for key, value in scores.items() if key != best)
    if best == "target" and others - scores[best] > 0.25 * gain:
        return Finding(name, Status.PASSED, observed, expected)
    if best == "target":
        cause = "the loss scores the targets barely better than its neighbours: the text repeats tokens too often to tell"
        return Finding(name, Status.WARNING, observed, expected, cause, "run the probe on a batch of varied text")
    if best == "next target":
        cause = (
            "the loss scores position t against the token after the next: the targets are already the next tokens, and the loss "
            "shifts them once more (shifted twice), so the model learns to predict t + 2"
        )
        fix = "drop the shift in the model's loss(): the data adapter's targets are the next tokens already (or shift in one place only)"
    else:
        cause = (
            "the loss scores each position against its own input token (not shifted): the model learns to copy its input, and the "
            "loss falls without it learning anything"
        )
        fix = "score the logits against the targets the adapter returns (the next tokens), or shift the labels by one"
    return Finding(name, Status.FAILED, observed, expected, cause, fix)


def scored_positions(parts: Components, batch: Batch) -> torch.Tensor:
    """(batch, seq) bool: the positions the task loss scores (its gradient reaches their logits)."""
    inputs = batch[0]
    with torch.no_grad(), eval_mode(parts.model), seeded(parts):
        logits = parts.model(inputs).float()
    logits.requires_grad_(True)
    parts.score(logits, batch).backward()
    return logits.grad.abs().sum(-1) > 0


def scored_tokens(parts: Components, batches: list[Batch], min_share: float = 0.8, never: float = 0.05, min_count: int = 3) -> Finding:
    """Every token id of the text is scored as a target where it occurs mid-sequence. The positions t < T - 1 that are
    followed by a scored position in their row are the text (not the padding at its end); if the loss scores most of
    them (min_share) and yet one token id is scored at no more than `never` of its occurrences as the next token, that
    token is masked by its id: a pad id that is also the EOS id, so the model never learns to stop."""
    name = "every token is scored"
    expected = f"each token id scored at > {never:.0%} of its occurrences in the text (when the loss scores >= {min_share:.0%} of it)"
    inputs = batches[0][0]
    if not next_token_task(batches[0]) or inputs.is_floating_point() or inputs.shape[1] < 3:
        return Finding(name, Status.SKIPPED, f"not a next-token task over token ids (inputs {tuple(inputs.shape)})", expected)
    occurrences: dict[int, int] = {}
    hits: dict[int, int] = {}
    total = scored_total = 0
    for batch in batches:
        scored = scored_positions(parts, batch).cpu()
        tokens = batch[0].cpu()
        later = scored.flip(-1).cumsum(-1).flip(-1)  # scored positions at or after each position
        text = torch.zeros_like(scored)
        text[:, :-2] = later[:, 1:-1] > 0  # position t is text when some position after it is scored
        nexts, marks = tokens[:, 1:][text[:, :-1]], scored[:, :-1][text[:, :-1]]
        total, scored_total = total + int(nexts.numel()), scored_total + int(marks.sum())
        for token, mark in zip(nexts.tolist(), marks.tolist()):
            occurrences[token] = occurrences.get(token, 0) + 1
            hits[token] = hits.get(token, 0) + int(mark)
    share = scored_total / total if total else 0.0
    observed = f"the loss scores {share:.0%} of {total} positions of text"
    if share < min_share:
        return Finding(name, Status.SKIPPED, observed + ": a task that scores part of each sequence on purpose (answers, completions)", expected)
    masked = sorted((token for token, count in occurrences.items() if count >= min_count and hits[token] <= never * count), key=occurrences.get, reverse=True)
    if not masked:
        return Finding(name, Status.PASSED, observed, expected)
    listed = ", ".join(f"id {token} ({hits[token]} of {occurrences[token]})" for token in masked[:4])
    return Finding(
        name,
        Status.WARNING,
        f"{observed}; never as the next token: {listed}",
        expected,
        f"the loss never scores token {masked[0]} although it occurs in the middle of the text: it is masked by its id, as padding is "
        "(a pad id that is also the EOS id: the model never learns to end a document)",
        "mask padding by position (the sequence lengths), not by the pad id; or give padding an id of its own",
    )


def _same(first: Batch, second: Batch) -> bool:
    return torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def distinct_data(parts: Components, batch_size: int) -> Finding:
    """The ranks of a data-parallel step, and the microbatches of one step, get different sequences: asked for two
    ranks, and for microbatches 0 and 1, the adapter must not repeat itself (a dataset that ignores the rank gives
    every rank the same batch; workers that each stream the whole dataset repeat every sample)."""
    data, name = parts.data, "distinct data per rank and microbatch"
    size = 2 * max(1, (batch_size + 1) // 2)
    expected = "rank 0 and rank 1 of a step, and its microbatches 0 and 1, get different sequences"
    ranks = [data.batch("train", 1, 0, size, rank=rank, num_ranks=2) for rank in (0, 1)]
    micros = [data.batch("train", 1, micro, size, rank=0, num_ranks=1) for micro in (0, 1)]
    if _same(*ranks):
        return Finding(
            name,
            Status.FAILED,
            "ranks 0 and 1 of 2 get the same sequences",
            expected,
            "every rank trains on the same data: the adapter ignores `rank` (an iterable dataset not split by rank), so N ranks "
            "cost N times the compute of one and see no more data",
            "take rank `rank`'s share of the global batch in batch() (TokenCorpus does), or split the dataset by node",
        )
    if _same(*micros):
        return Finding(
            name,
            Status.FAILED,
            "microbatches 0 and 1 of one step get the same sequences",
            expected,
            "every microbatch of a step repeats the same data: the adapter ignores `micro` (like workers that each stream the whole "
            "dataset), so gradient accumulation adds no data",
            "derive each batch from (seed, split, step, micro, rank), as TokenCorpus does",
        )
    return Finding(name, Status.PASSED, "different sequences for each rank and microbatch", expected)
