"""A zoo of deliberately broken parts, and user stages, for the validation ladder's tests. Each breaker changes
built Components in place the way a real bug would; configs reach the stages here with build.allow=[tests.ladder_zoo.<the stage>]."""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status
from currytrain.components import Components
from currytrain.data.corpus import TokenCorpus
from currytrain.model.protocol import causal_lm_loss
from currytrain.trainer.step import StepResult


def double_softmax(parts: Components) -> None:
    """The model returns probabilities; cross_entropy applies log_softmax on top of them."""
    model = parts.model
    readout = model.readout
    model.readout = lambda h: torch.softmax(readout(h), dim=-1)


def step_without_zero_grad(parts: Components, batch) -> StepResult:
    """A hand-written training step that forgets optimizer.zero_grad()."""
    inputs, targets = batch
    loss = causal_lm_loss(parts.model(inputs), targets)
    loss.backward()
    parts.optimizer.step()
    return StepResult(loss=float(loss.detach()), grad_norm=0.0, skipped=False, num_tokens=targets.numel())


def eval_mode_during_training(parts: Components) -> None:
    """model.eval() for an evaluation, and no model.train() afterwards."""
    parts.model.eval()


def dropout_in_eval_mode(parts: Components) -> None:
    """Dropout called with training=True instead of self.training: random in eval too."""
    model = parts.model
    readout = model.readout
    model.readout = lambda h: F.dropout(readout(h), p=0.1, training=True)


class LeakyCorpus(TokenCorpus):
    """An off-by-one in the batching: the inputs are the targets themselves."""

    def batch(self, split, step, micro, batch_size, rank=0, num_ranks=1):
        _, targets = super().batch(split, step, micro, batch_size, rank, num_ranks)
        return targets.clone(), targets


def label_in_inputs(parts: Components) -> None:
    data = parts.data
    parts.data = LeakyCorpus(data.train, data.val, data.seq_len, data.seed)


def val_is_train(parts: Components) -> None:
    """A split that holds out nothing: val is a slice of train."""
    data = parts.data
    data.val = data.train[: len(data.val)].clone()


class _BidirectionalFunctional(types.ModuleType):
    """torch.nn.functional with the attention's causal mask switched off."""

    def __getattr__(self, name):
        return getattr(F, name)

    @staticmethod
    def scaled_dot_product_attention(q, k, v, is_causal=False, scale=None, **kwargs):
        return F.scaled_dot_product_attention(q, k, v, is_causal=False, scale=scale, **kwargs)


def non_causal_mask(monkeypatch) -> None:
    import currytrain.model.layers as layers

    monkeypatch.setattr(layers, "F", _BidirectionalFunctional("functional"))


@torch.no_grad()
def zeroed_layer(parts: Components, index: int = 0) -> None:
    """Every weight of one block set to zero: the block outputs nothing and learns nothing."""
    for param in parts.model.layers[index].parameters():
        param.zero_()


def detached_block(parts: Components, index: int = 0) -> None:
    """A block whose output is detached: no gradient flows back through it."""
    block = parts.model.layers[index]
    forward = block.forward
    block.forward = lambda *args: forward(*args).detach()


def frozen_embedding(parts: Components) -> None:
    parts.model.tok_embeddings.weight.requires_grad_(False)


def blocks(parts: Components) -> list:
    """The repeated blocks the ladder's per-block probes see (currytrain.model.protocol.find_blocks)."""
    from currytrain.model.protocol import find_blocks

    return find_blocks(parts.model)


# ---------------------------------------------------------------------------------------------- user stages


class CountingStage(Stage):
    """A user stage: passes and counts the model's parameters (proves stages plug in from config)."""

    name = "count"

    def __init__(self, minimum: int = 1):
        self.minimum = minimum

    def assess(self, parts: Components, ctx: StageContext) -> StageResult:
        count = sum(p.numel() for p in parts.model.parameters())
        status = Status.PASSED if count >= self.minimum else Status.FAILED
        return StageResult(self.name, [Finding("parameter count", status, str(count), f">= {self.minimum}", "a small model", "raise model.dim")])


class RaisingStage(Stage):
    """A user stage whose assessment raises: the ladder must report it as a failed finding, not crash."""

    name = "boom"
    needs_components = False

    def assess(self, parts: Components, ctx: StageContext) -> StageResult:
        return StageResult(self.name, [Finding("ratio", Status.PASSED, str(1 / 0), "")])
