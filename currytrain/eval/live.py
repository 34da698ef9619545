"""The model as the evaluators run it: the live training model with its parallelism (in the loop) or a loaded one
(`currytrain eval`), under the run's autocast, its logits gathered whole, every rank in step.

Sharded forwards are collectives (FSDP gathers each block's weights, TP exchanges activations), so every rank must
run as many forwards as the others: each rank evaluates its share of the work (split over the data-parallel ranks;
tensor-parallel ranks share one), and a rank with less to do runs padding batches whose results it drops
(`in_step`, `agree`). Tensor parallelism shards the sequence (sequence parallel): inputs are right-padded to a
multiple of its degree, which causal attention ignores for the positions before.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from currytrain.model.protocol import full
from currytrain.parallel.state import ParallelState


@dataclass
class LiveModel:
    """What an evaluator calls: logits of token batches, and the ranks' agreement on how many to run."""

    model: nn.Module
    state: ParallelState
    autocast_dtype: torch.dtype | None = None
    context: int | None = None
    """Tokens per sequence at most (the evaluators' eval.seq_len, else the run's)."""

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def sharded(self) -> bool:
        """Whether forwards are collectives (several processes): then ranks run in step and recompute generation."""
        return self.state.world_size > 1

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """fp32 logits (batch, seq, vocab) of `tokens` (batch, seq), gathered whole under tensor parallelism."""
        tokens = tokens.to(self.device)
        length = tokens.shape[1]
        multiple = self.state.dims.tp if self.state.dims is not None else 1
        if length % multiple:
            tokens = F.pad(tokens, (0, multiple - length % multiple))
        autocast = torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None)
        with torch.no_grad(), autocast:
            out = self.model(tokens)
        return full(out)[:, :length].float()

    def agree(self, count: int) -> int:
        """The largest of every rank's `count` (every rank calls it at the same point)."""
        return self.state.max_over_world(count) if self.sharded else count

    def in_step(self, batches: Sequence[Any]) -> Iterator[tuple[Any, bool]]:
        """(batch, real) for this rank's batches, then padding (its last batch again, real=False) until it has run
        as many as the rank with the most."""
        total = self.agree(len(batches))
        for index in range(total):
            if index < len(batches):
                yield batches[index], True
            elif batches:
                yield batches[-1], False
            else:
                yield None, False

    def sum_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """`values` summed over the data-parallel ranks (each holds its share's sums; tensor-parallel ranks repeat it)."""
        group = self.state.view("batch")
        if group is None or group.size() == 1:
            return values
        total = values.detach().clone().to(self.device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group.get_group())
        return total


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode and every random state (Python, NumPy, torch's CPU and CUDA generators) as they were before, after:
    an evaluation changes nothing the training's next step reads."""
    states = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
