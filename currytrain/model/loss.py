"""The cross-entropy of the default loss (causal_lm_loss), with a faster path for bf16 logits on the CPU.

F.cross_entropy on bf16 logits, with the upcast that keeps the loss in fp32, makes four passes over a tensor
the size of the logits in fp32: the upcast copy, log-softmax, the zero-filled gradient of the NLL and the
log-softmax backward, and casts the gradient back to bf16. On the CPU these passes run at memory speed and, at
an 8k vocabulary, take a sixth of a small model's bf16 step. chunked_cross_entropy reads the logits once, a few
rows at a time so that each row's fp32 copy stays in cache: it takes the row's log-sum-exp and target logit and,
when the logits need a gradient, writes softmax - one-hot (scaled by the row's share of the mean) as bf16 right
away, so the backward only scales that by the incoming gradient. The loss and the gradient are those of
F.cross_entropy up to fp32 rounding (the gradient to the last bf16 bit).

It is used for plain CPU tensors of bf16 logits outside torch.compile (which fuses F.cross_entropy by itself);
every other case (fp32, fp16, whose stored gradient could underflow, a GPU, a DTensor under loss_parallel)
calls F.cross_entropy as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_BYTES = 2 << 20
"""The fp32 rows processed at once: about one core's L2 cache (2 MB: 64 rows of an 8k vocabulary)."""


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean cross-entropy in fp32 of logits (tokens, classes) against class indices (tokens,), skipping
    `ignore_index` targets: chunked_cross_entropy where it applies, else F.cross_entropy of the upcast logits."""
    if (
        type(logits) is torch.Tensor
        and logits.dtype == torch.bfloat16
        and logits.device.type == "cpu"
        and not targets.is_floating_point()
        and not torch.compiler.is_compiling()
    ):
        return chunked_cross_entropy(logits, targets, ignore_index)
    return F.cross_entropy(logits.float(), targets, ignore_index=ignore_index)


def chunked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """F.cross_entropy(logits.float(), targets, ignore_index=ignore_index) over 2-D logits, computed a few rows
    at a time with the gradient written during the forward (see the module's docstring)."""
    return _ChunkedCrossEntropy.apply(logits, targets, ignore_index)


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
        tokens, classes = logits.shape
        rows = max(1, CHUNK_BYTES // (4 * classes))
        valid = targets != ignore_index
        count = valid.sum()
        # Each row's share of the mean: F.cross_entropy's gradient is zero, not NaN, when every target is ignored.
        share = valid / count.clamp(min=1)
        index = torch.where(valid, targets, 0).unsqueeze(1)
        losses = torch.empty(tokens, dtype=torch.float32, device=logits.device)
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        minus_one = torch.full((rows, 1), -1.0, device=logits.device)
        for start in range(0, tokens, rows):
            end = min(start + rows, tokens)
            x = logits[start:end].to(torch.float32, copy=True)
            lse = torch.logsumexp(x, dim=1)
            target = index[start:end]
            losses[start:end] = lse - x.gather(1, target).squeeze(1)
            if grad is not None:
                probs = x.sub_(lse.unsqueeze(1)).exp_()
                probs.scatter_add_(1, target, minus_one[: end - start])
                grad[start:end] = probs.mul_(share[start:end].unsqueeze(1))
        ctx.save_for_backward(grad)
        # the mean over the scored targets: NaN when there are none, as F.cross_entropy's
        return losses.mul_(valid).sum() / count

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (grad,) = ctx.saved_tensors
        # A 0-d fp32 factor multiplies in fp32 and rounds once (a loss / 3 of gradient accumulation stays exact).
        return grad * grad_output, None, None
