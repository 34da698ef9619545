"""Pipeline parallelism over the mesh's pp axis: a decoder's stages built from the plan (pipeline.py) and run by
torch's schedules.

Each pp rank keeps, of the whole model, only what its stages own (apply_pp_split): its blocks under their indices
in the whole model (so parameter names, and so DCP checkpoints, do not depend on the layout), the token embedding
on the rank of the first stage, the final norm and the output projection on the rank of the last. That pruned
model is what the optimizer, the checkpoints and the memory report see. Each stage runs through a StageModule, a
view of the parts of one stage, wrapped in torch's PipelineStage; one torch.distributed.pipelining schedule drives
the stages of every rank (PipelineRunner), with trainer.grad_accum microbatches and the loss on the last stage.

With data parallelism too (pp x dp: the mesh's pp axis outermost), each pp group is one replica of the pipeline: it
runs the schedule on its dp share of the batch, and after the schedule the gradients of its stages are averaged over
the ranks that hold the same stages (the dp view), one all-reduce of one flat buffer per step. DDP's reducer is not
used: it hooks the root module's forward, which the schedule never calls (it runs StageModules).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

from currytrain.parallel.pipeline import SCHEDULES, PipelinePlan
from currytrain.parallel.state import Normalization, step_scale

log = logging.getLogger(__name__)


class KeptLayers(nn.ModuleList):
    """The blocks a pp rank keeps, registered under their indices in the whole model (layers.5 stays layers.5).
    Iterating and positional indexing see the kept blocks in order, as for a ModuleList of them."""

    def __init__(self, kept: dict[int, nn.Module]):
        super().__init__()
        for index, block in kept.items():
            self.add_module(str(index), block)

    def __getitem__(self, index):
        return list(self._modules.values())[index]

    def __setitem__(self, index: int, module: nn.Module) -> None:
        setattr(self, list(self._modules)[index], module)

    def block(self, layer: int) -> nn.Module:
        """The block that is layer `layer` of the whole model."""
        return self._modules[str(layer)]


class StageModule(nn.Module):
    """One stage of a pruned decoder: its blocks (and the embedding on the first stage, the readout on the last).
    Only those parts are registered here, so the stage's parameters are its own (PipelineStage scales its
    gradients); the decoder is kept outside the module tree for its RoPE tables and readout."""

    def __init__(self, decoder: nn.Module, layers: range, first: bool, last: bool):
        super().__init__()
        self.decoder = [decoder]  # a list: not registered as a submodule
        self.tok_embeddings = decoder.tok_embeddings if first else None
        self.layers = nn.ModuleList(decoder.layers.block(layer) for layer in layers)
        self.layer_rope = [decoder.layer_rope[layer] for layer in layers]
        self.norm, self.output = (decoder.norm, decoder.output) if last else (None, None)

    def forward(self, x):
        decoder = self.decoder[0]
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        tables = decoder.rope_tables(h.shape[1])
        for layer, table in zip(self.layers, self.layer_rope):
            h = layer(h, *tables[table])
        return decoder.readout(h) if self.output is not None else h


def apply_pp_split(model, plan: PipelinePlan, pp_rank: int) -> None:
    """Delete, in place, every part of `model` the stages of `pp_rank` do not own (see the module docstring)."""
    stages = plan.stages_of(pp_rank)
    kept = sorted(layer for stage in stages for layer in plan.layers_of(stage))
    model.layers = KeptLayers({layer: model.layers[layer] for layer in kept})
    if 0 not in stages:
        model.tok_embeddings = None
    if plan.num_stages - 1 not in stages:
        model.norm = None
        model.output = None
    log.info("pipeline parallel: pp rank %d runs stages %s (layers %s) of %d", pp_rank, stages, kept, plan.num_stages)


class PipelineRunner:
    """This rank's stages under one torch schedule: the training step (forward, loss on the last stage, backward,
    over trainer.grad_accum microbatches) and the forward-only eval. Losses come back on every pp rank."""

    def __init__(self, model, plan: PipelinePlan, pp_mesh, loss_fn: Callable, num_micro: int, device, replicas=None):
        """replicas: the mesh of the ranks that run the same stages on other shares of the batch (the dp view under
        pp x dp); their gradients are averaged after each step. None (or one rank) without data parallelism."""
        self.group = pp_mesh.get_group()
        self.replicas = replicas.get_group() if replicas is not None and replicas.size() > 1 else None
        pp_rank = pp_mesh.get_local_rank()
        self.stage_ids = plan.stages_of(pp_rank)
        self.is_first = 0 in self.stage_ids
        self.is_last = plan.num_stages - 1 in self.stage_ids
        self.last_rank = dist.get_global_rank(self.group, plan.rank_of_last_stage())
        self.num_micro = num_micro
        self.loss_fn = loss_fn
        self.scale: float | torch.Tensor = 1.0  # this step's ranks / scored targets (step); 1 to evaluate: sums
        self.modules = [StageModule(model, plan.layers_of(s), s == 0, s == plan.num_stages - 1) for s in self.stage_ids]
        stages = [PipelineStage(m, s, plan.num_stages, device, group=self.group) for m, s in zip(self.modules, self.stage_ids)]
        kind = get_schedule_class(SCHEDULES[plan.schedule])
        # Each microbatch's loss is its sum times the step's scale (ranks / scored targets): the schedule must not
        # divide the gradients by the number of microbatches again.
        self.schedule = kind(
            stages[0] if issubclass(kind, PipelineScheduleSingle) else stages, n_microbatches=num_micro, loss_fn=self._scaled_loss, scale_grads=False
        )

    def _scaled_loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(output, targets) * self.scale

    def _run(self, run: Callable, inputs, targets, autocast_dtype) -> Any:
        losses: list = []
        autocast = torch.autocast(inputs.device.type, dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
        with autocast:
            run(
                *((inputs,) if self.is_first else ()),
                target=targets if self.is_last else None,
                losses=losses if self.is_last else None,
                return_outputs=False,
            )
        # Every pp rank gets the last stage's per-microbatch losses, so metrics, journal and hooks agree.
        values = torch.stack([loss.detach().float() for loss in losses]) if self.is_last else torch.zeros(self.num_micro, device=inputs.device)
        dist.broadcast(values, src=self.last_rank, group=self.group)
        return values

    def step(self, microbatches: Sequence[tuple[Any, Any]], device, normalization: Normalization, autocast_dtype=None) -> torch.Tensor:
        """Forward and backward of the microbatches, gradients accumulated in the stages' parameters, each
        microbatch's summed loss scaled by the step's ranks / scored targets (Normalization: the targets
        of every microbatch of every replica, counted before the schedule runs); returns this rank's share of the
        step's loss (the sum of the scaled losses) on the device."""
        step_count = normalization.total(sum(normalization.count(targets) for _, targets in microbatches), device)
        self.scale = step_scale(step_count, normalization.ranks)
        inputs = torch.cat([inputs for inputs, _ in microbatches]).to(device, non_blocking=True)
        targets = torch.cat([targets for _, targets in microbatches]).to(device, non_blocking=True)
        try:
            losses = self._run(self.schedule.step, inputs, targets, autocast_dtype)
        finally:
            self.scale = 1.0
        if self.replicas is not None:
            self._average_gradients()
        return losses.sum()

    def _average_gradients(self) -> None:
        """Average this rank's stage gradients over the replicas of its stages: one flat buffer, one all-reduce."""
        grads = [param.grad for module in self.modules for param in module.parameters() if param.grad is not None]
        if not grads:
            return
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        dist.all_reduce(flat, group=self.replicas)  # gloo has no ReduceOp.AVG: sum, then divide
        flat /= dist.get_world_size(self.replicas)
        for grad, averaged in zip(grads, flat.split([grad.numel() for grad in grads])):
            grad.copy_(averaged.view_as(grad))

    def eval_losses(self, batches: Sequence[tuple[Any, Any]], device, autocast_dtype=None) -> list[float]:
        """The summed loss of each batch, forward only: the batches go through in groups of the schedule's
        microbatch count, each batch one microbatch (the last group is filled up with copies, whose losses are
        dropped)."""
        losses: list[float] = []
        for start in range(0, len(batches), self.num_micro):
            group = list(batches[start : start + self.num_micro])
            used = len(group)
            group += [group[-1]] * (self.num_micro - used)
            inputs = torch.cat([inputs for inputs, _ in group]).to(device)
            targets = torch.cat([targets for _, targets in group]).to(device)
            losses += self._run(self.schedule.eval, inputs, targets, autocast_dtype)[:used].tolist()
        return losses
