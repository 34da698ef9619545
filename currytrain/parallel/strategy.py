"""Parallel: the one class every conf/parallel/*.yaml builds. It opens this process's place in the job
(process group + mesh -> ParallelState), parallelizes the model, and wraps the optimizer for ZeRO-1.

    zero_stage 0 (ddp)    gradients all-reduced (torch's DDP, applied in place via composable replicate)
    zero_stage 1 (zero1)  DDP + ZeroRedundancyOptimizer: each rank keeps the optimizer state of its params
    zero_stage 2 (zero2)  FSDP2 fully_shard, parameters stay gathered from forward to backward
    zero_stage 3 (fsdp)   FSDP2 fully_shard, parameters resharded after forward (hsdp: over dp_shard,
                          replicated over dp_replicate)

runtime=fabric hands the data-parallel wrapping, the precision and the backward to Lightning Fabric (DDP only);
the process group, the mesh and everything else stay curryTrain's.
"""

from __future__ import annotations

import gc
import inspect
import logging
import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn

from currytrain.errors import ConfigError, format_problems
from currytrain.parallel.dims import ParallelDims
from currytrain.parallel.parallelize import parallelize_decoder
from currytrain.parallel.pipeline import PipelinePlan
from currytrain.parallel.state import ParallelState, resolve_device

if TYPE_CHECKING:
    from currytrain.parallel.stages import PipelineRunner

log = logging.getLogger(__name__)

FABRIC_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
"""trainer.precision -> Fabric's precision plugin (fp16 is refused with Fabric at validation)."""


class Parallel:
    def __init__(
        self,
        nproc: int = 1,
        dp_replicate: int = 1,
        dp_shard: int = 1,
        cp: int = 1,
        tp: int = 1,
        pp: int = 1,
        ep: int = 1,
        pp_schedule: str = "1f1b",
        pp_split: list[int] | None = None,
        zero_stage: int = 0,
        runtime: str = "torch",
        backend: str = "auto",
        hang_timeout: float = 1800.0,
        rendezvous_timeout: float = 300.0,
    ):
        """The fields of ParallelConfig (see there); hang_timeout and rendezvous_timeout are the
        launchers' (HangWatch, a SLURM job's roll call in currytrain.workers), not used here."""
        self.nproc = nproc
        self.degrees = {"dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp, "pp": pp, "ep": ep}
        self.pp_schedule, self.pp_split = pp_schedule, list(pp_split) if pp_split else None
        self.zero_stage, self.runtime, self.backend = zero_stage, runtime, backend
        self._owns_group = False

    def setup(self, device: str, precision: str = "fp32") -> ParallelState:
        """Join the job (WORLD_SIZE/RANK/LOCAL_RANK from the launcher; one process without them).
        `precision` (trainer.precision) matters only to Fabric, which owns it under runtime=fabric."""
        world, rank, local_rank = (int(os.environ.get(key, default)) for key, default in (("WORLD_SIZE", 1), ("RANK", 0), ("LOCAL_RANK", 0)))
        torch_device = resolve_device(device, local_rank)
        fabric = self._launch_fabric(torch_device, world, precision) if self.runtime == "fabric" else None
        if world == 1 and self.zero_stage == 0:
            return ParallelState(device=torch_device, fabric=fabric)  # one replica: nothing to all-reduce, no group needed
        node = DictConfig({**self.degrees, "zero_stage": self.zero_stage, "nproc": self.nproc})
        problems = ParallelDims.problems(node, "parallel", world)
        if problems:
            raise ConfigError(format_problems(problems))
        if torch_device.type == "cuda":
            torch.cuda.set_device(torch_device)
        self._init_process_group(torch_device, world)
        dims = ParallelDims.resolve(node, world)
        mesh, views = dims.build_mesh(torch_device.type)
        state = ParallelState(rank=rank, local_rank=local_rank, world_size=world, device=torch_device, mesh=mesh, dims=dims, views=views, fabric=fabric)
        log.info("parallel: world %d, dp_replicate=%d x dp_shard=%d, zero_stage=%d", world, dims.dp_replicate, dims.dp_shard, self.zero_stage)
        return state

    def _launch_fabric(self, device: torch.device, world: int, precision: str):
        """A Fabric over the processes the launcher already started (torchrun's environment: Fabric spawns
        nothing); with several, it opens the process group (DDP over gloo or NCCL)."""
        from lightning.fabric import Fabric  # seconds to import: only when chosen

        logging.getLogger("lightning.fabric").setLevel(logging.WARNING)  # its banner would repeat on every rank
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        fabric = Fabric(
            accelerator=device.type,
            devices=local_world,
            num_nodes=max(1, world // local_world),
            strategy="ddp" if world > 1 else "auto",
            precision=FABRIC_PRECISION[precision],
        )
        self._owns_group = world > 1 and not dist.is_initialized()
        fabric.launch()
        return fabric

    def _init_process_group(self, device: torch.device, world: int) -> None:
        if dist.is_initialized():
            return
        backend = self.backend if self.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        if world == 1 and "MASTER_ADDR" not in os.environ:  # a one-process job needs no rendezvous
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group(backend)  # env:// from torchrun, launch.py's workers or SLURM
        self._owns_group = True

    def apply(self, model: nn.Module, state: ParallelState, model_cfg: DictConfig, precision: str = "fp32", compile: bool = False) -> nn.Module:
        """Move the model to this process's device, then parallelize it (TP, AC, compile, FSDP in that order);
        DDP (zero_stage 0/1) last, in place, so the model keeps its class and its state-dict keys.
        precision (trainer.precision): FSDP gathers bf16 parameters for bf16 runs (MixedPrecisionPolicy).
        compile (trainer.compile): torch.compile each block."""
        param_dtype = torch.bfloat16 if precision == "bf16" and state.fabric is None else None
        model = parallelize_decoder(
            model.to(state.device),
            state,
            model_cfg,
            zero_stage=self.zero_stage,
            param_dtype=param_dtype,
            compile=compile,
            pipeline=self.pipeline_plan(state, model_cfg),
        )
        if state.fabric is not None:
            return state.fabric.setup_module(model)  # DDP and the precision's autocast around forward
        pipelined = state.dims is not None and state.dims.pp > 1  # pp x dp: PipelineRunner averages the stage gradients itself
        if state.mesh is not None and self.zero_stage < 2 and state.view("loss").size() > 1 and not pipelined:  # one dp rank (tp only): nothing to all-reduce
            from torch.distributed._composable.replicate import replicate

            # Expert-parallel experts are each rank's own (their gradients are handled in parallel/expert.py).
            from currytrain.parallel.expert import ExpertParallelExperts

            experts = [module for module in model.modules() if isinstance(module, ExpertParallelExperts)]
            replicate(model, ignored_modules=experts, process_group=state.view("loss").get_group())
        return model

    def pipeline_plan(self, state: ParallelState, model_cfg: DictConfig) -> PipelinePlan | None:
        """The stages and their layers under pipeline parallelism; None without it."""
        if state.dims is None or state.dims.pp == 1:
            return None
        return PipelinePlan.of(state.dims.pp, self.pp_schedule, self.pp_split, model_cfg.n_layers)

    def build_pipeline(self, model: nn.Module, state: ParallelState, model_cfg: DictConfig, loss_fn, num_micro: int) -> PipelineRunner | None:
        """The schedule that runs this rank's stages of the (already split) `model`, with `num_micro` microbatches per
        step and `loss_fn` on the last stage; None without pipeline parallelism."""
        plan = self.pipeline_plan(state, model_cfg)
        if plan is None:
            return None
        from currytrain.parallel.stages import PipelineRunner  # torch's pipelining: imported only when used

        # pp x dp: the ranks of the other pipeline replicas that hold the same stages average their gradients.
        return PipelineRunner(model, plan, state.views["pp"], loss_fn, num_micro, state.device, replicas=state.view("loss"))

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, state: ParallelState) -> torch.optim.Optimizer:
        """ZeRO-1: rebuild the optimizer as a ZeroRedundancyOptimizer over the same param groups, so each dp
        rank keeps (and updates) the state of its share of the parameters only."""
        if state.fabric is not None:
            return state.fabric.setup_optimizers(optimizer)
        if self.zero_stage != 1 or state.mesh is None:
            return optimizer
        from torch.distributed.optim import ZeroRedundancyOptimizer

        kind = type(optimizer)
        accepted = inspect.signature(kind.__init__).parameters
        defaults = {key: value for key, value in optimizer.defaults.items() if key in accepted}
        groups = [{**group, "params": list(group["params"])} for group in optimizer.param_groups]
        return ZeroRedundancyOptimizer(groups, optimizer_class=kind, process_group=state.view("batch").get_group(), **defaults)

    @staticmethod
    def unwrap(model: nn.Module, state: ParallelState) -> nn.Module:
        """The model as built, with its own parameter names (what checkpoints and weight loading see):
        Fabric's wrapper prefixes them; torch's own wrapping is in place and changes none."""
        return model.module if state.fabric is not None else model

    def teardown(self) -> None:
        if self._owns_group and dist.is_initialized():
            # The trained model (DDP's reducer, FSDP's hooks) lives on in reference cycles that hold the process
            # group and its last works. Collected at exit instead, gloo's threads can free tensors after the
            # interpreter is gone: SIGABRT, "terminate called without an active exception" (a rare flake).
            gc.collect()
            dist.destroy_process_group()
        self._owns_group = False
