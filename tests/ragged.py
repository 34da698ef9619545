"""Masked data whose sequences score very different numbers of targets (a prompt of random length is not scored, as
in fine-tuning), and losses of a model's own in each form the model protocol takes: what tests/test_loss_math.py and
its workers (tests/loss_worker.py) train on.

RaggedTokens indexes its sequences within a step, so that every layout of the same global batch (one microbatch,
K of them, 2 ranks, 2 ranks x K) sees the same sequences: the batch of (step, micro, rank) holds the sequences
micro * batch_size + rank * share + (0 .. share - 1) of that step."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from currytrain.data.base import stable_seed


class RaggedTokens:
    """Random tokens (vocab_size ids) whose targets are the next token, the first `prompts[i]` of sequence i not
    scored (ignore_index): sequences alternate between scoring almost nothing and almost everything."""

    def __init__(
        self, seq_len: int = 32, vocab_size: int = 256, seed: int = 0, ignore_index: int = -100, scored: tuple[int, ...] = (2, 30, 1, 24, 5, 31, 3, 20)
    ):
        self.seq_len, self.vocab_size, self.seed = seq_len, vocab_size, seed
        self.ignore_index = ignore_index
        self.scored = scored
        """How many targets sequence i of a step scores (i modulo its length): the rest is its prompt."""

    def sequence(self, split: str, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(stable_seed(self.seed, "ragged", split, step, index))
        tokens = torch.randint(self.vocab_size, (self.seq_len + 1,), generator=g)
        targets = tokens[1:].clone()
        targets[: self.seq_len - self.scored[index % len(self.scored)]] = self.ignore_index
        return tokens[:-1], targets

    def batch(self, split: str, step: int, micro: int, batch_size: int, rank: int = 0, num_ranks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        share = batch_size // num_ranks
        first = micro * batch_size + rank * share
        rows = [self.sequence(split, step, index) for index in range(first, first + share)]
        return torch.stack([inputs for inputs, _ in rows]), torch.stack([targets for _, targets in rows])

    def describe(self) -> dict:
        return {"kind": "ragged", "seq_len": self.seq_len, "vocab_size": self.vocab_size}


class SumCountLoss(RaggedTokens):
    """The same data with a loss of its own that says what it scored: (sum, count)."""

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = targets.reshape(-1)
        total = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), flat, ignore_index=self.ignore_index, reduction="sum")
        return total, (flat != self.ignore_index).sum()


class MaskedTokenLoss(RaggedTokens):
    """The same data with per-target losses and a mask of its own."""

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = targets != self.ignore_index
        losses = F.cross_entropy(logits.float().transpose(1, 2), targets.masked_fill(~mask, 0), reduction="none")
        return losses, mask


class ZeroMaskedSum(RaggedTokens):
    """The same data with a loss of its own that ignores target id 0 (which zero_prompts makes the prompts), said as
    (sum, count): the step counts the targets that are not ignore_index, the loss fewer, and the step puts the
    gradients right after."""

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = targets.reshape(-1)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), flat, ignore_index=0, reduction="sum"), (flat != 0).sum()


class MeanLoss(RaggedTokens):
    """The same data with a loss of its own that returns one number: the mean over the targets it scores, which are
    the ones the step counts (not ignore_index), so the step weighs it right."""

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=self.ignore_index)


class PromptMaskedMean(nn.Module):
    """A wrapper whose own loss() is a per-microbatch mean over a mask of its own (it ignores target id 0, which the
    data does not mark as ignore_index): the loss bug of transformers #34191 and torchtune #1875 in a model's own
    code, which no step can weigh right from one number."""

    def __init__(self, inner: nn.Module, ignored: int = 0):
        super().__init__()
        self.inner, self.ignored = inner, ignored

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.inner(inputs)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=self.ignored)


class PromptMaskedSum(PromptMaskedMean):
    """The same own mask, said right: (sum, count)."""

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = targets.reshape(-1)
        total = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), flat, ignore_index=self.ignored, reduction="sum")
        return total, (flat != self.ignored).sum()


def zero_prompts(data: RaggedTokens) -> RaggedTokens:
    """The same data with its prompts marked by target id 0 instead of ignore_index (what PromptMaskedMean ignores)."""
    source = data.sequence

    def sequence(split: str, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = source(split, step, index)
        return inputs, torch.where(targets == data.ignore_index, 0, targets.clamp(min=1))

    data.sequence = sequence
    return data
