"""The cross-entropy of the default loss (causal_lm_loss), with a faster path for large logits on the CPU.

F.cross_entropy on bf16 logits, with the upcast that keeps the loss in fp32, makes four passes over a tensor
the size of the logits in fp32: the upcast copy, log-softmax, the zero-filled gradient of the NLL and the
log-softmax backward, and casts the gradient back to bf16. On the CPU these passes run at memory speed and, at
an 8k vocabulary, take a sixth of a small model's bf16 step. chunked_cross_entropy reads the logits a few rows at
a time, so that each chunk's fp32 log-probabilities stay in cache: it takes each row's target log-probability
and, when the logits need a gradient, writes softmax - one-hot (scaled by the row's share of the mean) in the
logits' dtype right away, so the backward only scales that by the incoming gradient. The loss and the gradient
are F.cross_entropy's up to fp32 rounding (the gradient to the last bit of its dtype).

It takes bf16 logits larger than a chunk and fp32 ones larger than FP32_CHUNKS chunks, as plain CPU tensors
outside torch.compile (which fuses F.cross_entropy by itself): at those sizes it measured 1.0-3.2x (bf16) and
1.3-1.5x (fp32) faster, forward and backward (bench/cross_entropy.py). Every other case (fp16, whose stored
gradient could underflow before a loss scale multiplies it, a GPU, a DTensor under loss_parallel) calls
F.cross_entropy as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_BYTES = 2 << 20
"""The fp32 rows processed at once: about one core's L2 cache (2 MB: 64 rows of an 8k vocabulary)."""
FP32_CHUNKS = 8
"""fp32 logits take the chunked loss from this many chunks (16 MB: 512 tokens of an 8k vocabulary)."""


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy in fp32 of logits (tokens, classes) against class indices (tokens,), skipping `ignore_index`
    targets, their mean or (reduction="sum") their sum: chunked_cross_entropy where it is faster (chunked_pays),
    else F.cross_entropy of the upcast logits."""
    if chunked_pays(logits, targets):
        return chunked_cross_entropy(logits, targets, ignore_index, reduction)
    return F.cross_entropy(logits.float(), targets, ignore_index=ignore_index, reduction=reduction)


def chunked_pays(logits: torch.Tensor, targets: torch.Tensor) -> bool:
    """Plain CPU tensors outside torch.compile, class indices as targets, and logits in bf16 that outgrow one
    chunk, or in fp32 that outgrow FP32_CHUNKS of them (below that F.cross_entropy's passes stay in cache and
    the chunked loop gains nothing: docs/performance.md)."""
    if type(logits) is not torch.Tensor or logits.device.type != "cpu" or targets.is_floating_point() or torch.compiler.is_compiling():
        return False
    chunks = 4 * logits.numel() / CHUNK_BYTES
    return (logits.dtype == torch.bfloat16 and chunks > 1) or (logits.dtype == torch.float32 and chunks > FP32_CHUNKS)


def chunked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, reduction: str = "mean") -> torch.Tensor:
    """F.cross_entropy(logits.float(), targets, ignore_index=ignore_index, reduction=reduction) over 2-D logits
    (reduction "mean" or "sum"), computed a few rows at a time with the gradient written during the forward (see
    the module's docstring)."""
    return _ChunkedCrossEntropy.apply(logits, targets, ignore_index, reduction == "sum")


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, summed: bool) -> torch.Tensor:
        tokens, classes = logits.shape
        rows = max(1, CHUNK_BYTES // (4 * classes))
        targets = targets.long()  # byte targets too, as F.cross_entropy takes them (compared as integers)
        valid = targets != ignore_index
        count = valid.sum()
        # Each row's share of the loss (of the mean: F.cross_entropy's gradient is zero, not NaN, when every target
        # is ignored; of the sum: 1 where scored).
        share = (valid.float() if summed else valid / count.clamp(min=1)).unsqueeze(1)
        index = torch.where(valid, targets, 0).unsqueeze(1)
        log_probs = torch.empty(tokens, dtype=torch.float32, device=logits.device)
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        minus_one = torch.full((rows, 1), -1.0, device=logits.device)
        for start in range(0, tokens, rows):
            end = min(start + rows, tokens)
            chunk = torch.log_softmax(logits[start:end], dim=1, dtype=torch.float32)  # upcast in the kernel
            target = index[start:end]
            torch.gather(chunk, 1, target, out=log_probs[start:end].unsqueeze(1))
            if grad is not None:
                probs = chunk.exp_()
                probs.scatter_add_(1, target, minus_one[: end - start])
                torch.mul(probs, share[start:end], out=grad[start:end])  # rounded to the logits' dtype once
        ctx.save_for_backward(grad)
        total = -log_probs.mul_(valid).sum()
        # the mean over the scored targets: NaN when there are none, as F.cross_entropy's
        return total if summed else total / count

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (grad,) = ctx.saved_tensors
        # A 0-d fp32 factor multiplies in fp32 and rounds once: a step's 1 / (scored targets) adds one rounding.
        return grad * grad_output, None, None, None
