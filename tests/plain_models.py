"""Models written as a user would, in plain PyTorch: none of curryTrain's layers, blocks in `self.h`, their own
loss with their own ignore index and their own parameter groups (currytrain.model.protocol). The healthy one
must climb the ladder; each `bug` below plants one fault in it, and the tests assert the cause the ladder names.
Also a data adapter that pads its sequences, with and without declaring the pad as its ignore_index."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from currytrain.data.base import stable_seed
from currytrain.data.corpus import TokenCorpus

PAD = 0
"""The pad id of PaddedCorpus (and the ignore index of PlainLM's own loss)."""


class SelfAttention(nn.Module):
    """Causal multi-head self-attention written out (no scaled_dot_product_attention, no curryTrain layer)."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, eval_dropout: bool = False):
        super().__init__()
        self.heads, self.dropout, self.eval_dropout = heads, dropout, eval_dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        weights = scores.softmax(-1)
        # the bug: training=True instead of self.training keeps the dropout on in eval
        weights = F.dropout(weights, self.dropout, training=True if self.eval_dropout else self.training)
        return self.proj((weights @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float = 0.0, eval_dropout: bool = False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, dropout, eval_dropout)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class SaturatedBlock(nn.Module):
    """The "normalisation hides vanishing gradients" bug: no residual, and a sigmoid after a LayerNorm: the norm
    keeps every block's activations at one steady, healthy-looking scale while the gradient loses a factor of
    several in every block (the sigmoid's slope is at most 1/4)."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, eval_dropout: bool = False):
        super().__init__()
        self.attn = SelfAttention(dim, heads)
        self.fc = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.norm(self.fc(x + self.attn(x))))


class _Reverse(torch.autograd.Function):
    """A gradient-reversal layer (left over from domain-adversarial training): identity forward, -grad backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


class PlainLM(nn.Module):
    """A GPT-style decoder in plain PyTorch. `bug` plants one fault (see BUGS)."""

    def __init__(self, vocab_size: int = 256, dim: int = 32, n_layers: int = 2, heads: int = 2, max_len: int = 64, dropout: float = 0.0, bug: str = ""):
        super().__init__()
        self.bug = bug
        block = SaturatedBlock if bug == "norm_hides_vanishing" else Block
        self.wte, self.wpe = nn.Embedding(vocab_size, dim), nn.Embedding(max_len, dim)
        self.h = nn.ModuleList(
            block(dim, heads, 0.1 if bug == "eval_dropout" else dropout, bug == "eval_dropout") for _ in range(n_layers + 6 * (bug == "norm_hides_vanishing"))
        )
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        if self.bug == "gradient_reversal":
            x = _Reverse.apply(x)
        return self.head(x)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """Its own loss: the pad id is not scored; (sum, count) says so (currytrain.model.protocol)."""
        flat = targets.reshape(-1)
        if self.bug == "masked_mean_loss":  # one number: a mean over its own mask, which no step can weigh right
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), flat, ignore_index=PAD)
        value = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), flat, ignore_index=PAD, reduction="sum")
        return (-value if self.bug == "negated_loss" else value), (flat != PAD).sum()

    def param_groups(self):
        """Its own groups: no weight decay on norms, biases and embeddings."""
        decay = [p for n, p in self.named_parameters() if p.dim() >= 2 and "wte" not in n and "wpe" not in n]
        rest = [p for n, p in self.named_parameters() if not (p.dim() >= 2 and "wte" not in n and "wpe" not in n)]
        if self.bug == "missing_from_optimizer":  # the norms' gains and biases forgotten
            rest = [p for n, p in self.named_parameters() if p.dim() >= 2 and ("wte" in n or "wpe" in n)]
        if self.bug == "slow_blocks":  # a typo'd lr_scale: the blocks train 100x slower than the embeddings and head
            blocks = {id(p) for p in self.h.parameters()}
            return [
                {"params": [p for p in decay if id(p) not in blocks], "weight_decay": 0.1},
                {"params": [p for p in decay if id(p) in blocks], "weight_decay": 0.1, "lr_scale": 0.01},
                {"params": rest, "weight_decay": 0.0},
            ]
        return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]


BUGS = ("slow_blocks", "norm_hides_vanishing", "eval_dropout", "missing_from_optimizer", "gradient_reversal", "negated_loss", "masked_mean_loss")
"""The faults PlainLM can carry (padding counted in the loss is PaddedCorpus's, declare_pad=False)."""


class PaddedCorpus(TokenCorpus):
    """Sequences cut at a random length and padded with PAD to seq_len, inputs and targets alike (documents
    shorter than the window). declare_pad: the adapter declares PAD as its ignore_index, so the default loss does
    not score the padding; without it, a model with no loss of its own counts the padding in its loss (the bug)."""

    def __init__(self, train: torch.Tensor, val: torch.Tensor, seq_len: int, seed: int, declare_pad: bool = True):
        super().__init__(train, val, seq_len, seed)
        self.vocab_size = 256
        if declare_pad:
            self.ignore_index = PAD

    def batch(self, split, step, micro, batch_size, rank=0, num_ranks=1):
        inputs, targets = super().batch(split, step, micro, batch_size, rank, num_ranks)
        inputs, targets = inputs.clone(), targets.clone()
        generator = torch.Generator().manual_seed(stable_seed(self.seed, split, step, micro, rank))
        lengths = torch.randint(self.seq_len // 2, self.seq_len + 1, (inputs.shape[0],), generator=generator)
        positions = torch.arange(self.seq_len)
        pad = positions[None, :] >= lengths[:, None]
        inputs[pad] = PAD
        targets[pad | (positions[None, :] == lengths[:, None] - 1)] = PAD  # the last real token predicts the pad: padded too
        return inputs, targets


def padded(data: TokenCorpus, declare_pad: bool) -> PaddedCorpus:
    """The same streams behind PaddedCorpus's batches."""
    return PaddedCorpus(data.train, data.val, data.seq_len, data.seed, declare_pad)
