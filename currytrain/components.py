"""build_components: the one way to build the parts of a run (data, model, optimizer, schedule) from a
composed config. The Trainer, the benchmarks, the tests and the validation ladder all build through it, so
none of them drifts from what a real run trains.

The process group and device (the parallel session) are not built here: a worker opens one session and may
build components many times inside it (ladder stages, seeds).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig

from currytrain.build import allow_targets, build
from currytrain.errors import ConfigError
from currytrain.model import build_model
from currytrain.model.protocol import (
    ForwardLoss,
    LossFn,
    LossSum,
    TaskLoss,
    apply_document_boundaries,
    data_ignore_index,
    default_loss,
    model_loss,
    own_loss,
    task_loss,
    token_loss_sum,
)
from currytrain.optim.builders import build_scheduler
from currytrain.parallel.compile import compile_forward_loss, compile_loss, compiles_whole
from currytrain.parallel.float8 import FLOAT8_MULTIPLE, float8_linears
from currytrain.parallel.kernels import AttentionChoice, choose_attention_precision
from currytrain.parallel.state import Normalization, ParallelState

PRECISION_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
"""The autocast of each trainer.precision (fp8: bf16 around the float8 matmuls of currytrain/parallel/float8.py)."""


def step_autocast(cfg: DictConfig, state: ParallelState) -> torch.dtype | None:
    """The step's autocast; None under Fabric, whose precision plugin autocasts the forward itself."""
    return None if state.fabric is not None else PRECISION_DTYPES[cfg.trainer.precision]


@dataclass
class Components:
    """What one training run steps: built the way a run builds it, seeded by cfg.seed."""

    cfg: DictConfig
    state: ParallelState
    data: Any
    model: torch.nn.Module
    """Moved to state.device and parallelized (TP, AC, per-block compile, FSDP as configured)."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    module: torch.nn.Module
    """`model` as built, with its own parameter names (checkpoints, weight loading); `model` itself unless
    a runtime wrapped it (parallel.runtime=fabric)."""
    forward_loss: ForwardLoss
    """A microbatch's forward and loss (what accumulated_step runs): under trainer.compile on one process the
    model and the loss compiled as one graph, else model_loss(model, loss_fn)."""
    loss_fn: LossFn = token_loss_sum
    """The default loss of (logits, targets), summed over the targets that are not the data adapter's ignore_index;
    compiled under trainer.compile with parallelism. A model with its own loss() trains on that instead (task_loss)."""
    pipeline: Any = None
    """The PipelineRunner that steps this rank's stages under pipeline parallelism (parallel.pp > 1), else None."""
    task_loss: TaskLoss | None = None
    """(logits, batch) -> the task loss (a LossSum) the trainer's eval and the ladder's probes score: the data's or
    the model's own loss() when there is one (currytrain.model.protocol), else loss_fn. build_components sets it;
    None means loss_fn over the targets that are not the data adapter's ignore_index."""
    attention: AttentionChoice | None = None
    """The attention kernel's dtype trainer.attention_precision chose (the Trainer journals it), None where there
    was nothing to choose."""

    def score(self, logits: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The task loss of `logits` on `batch` per scored target (what one batch alone reports)."""
        return self.score_sum(logits, batch).mean

    def score_sum(self, logits: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> LossSum:
        """The task loss of `logits` on `batch` as (sum, scored targets): what evaluations add up over batches."""
        return (self.task_loss or task_loss(self.model, self.loss_fn, self.data))(logits, batch)

    @property
    def normalization(self) -> Normalization:
        """How a training step counts this run's scored targets, and over which ranks (trainer.step)."""
        return self.state.normalization(data_ignore_index(self.data), own=own_loss(self.module, self.data) is not None)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The step's autocast; None under Fabric, whose precision plugin autocasts the forward itself."""
        return step_autocast(self.cfg, self.state)


def build_components(cfg: DictConfig, state: ParallelState, data: Any = None, model: torch.nn.Module | None = None) -> Components:
    """Data, then the model (seeded by cfg.seed, then parallelized for `state`), then its optimizer and schedule.

    data: an adapter already built from this same cfg.data (the ladder's sub-runs share one), else built here.
    model: a module built by the caller (a test's plain nn.Module) in place of cfg.model's; everything else
    (parallelism, optimizer, losses) is built around it exactly as around cfg.model's.
    """
    allow_targets(cfg.build.allow)
    torch.manual_seed(cfg.seed)
    data = build(cfg.data) if data is None else data
    parallel = build(cfg.parallel)
    # trainer.compile: one graph of forward and loss on one process, else per block (see compiles_whole).
    # (trainer.compile=auto builds eager; the Trainer compiles the forward and loss later if it chooses to.)
    compile = cfg.trainer.compile is True
    whole = compile and compiles_whole(state)
    per_block = compile and not whole
    model = build_model(cfg.model) if model is None else model
    apply_document_boundaries(model, data)  # before parallelizing: the wrappers keep the module's own forward
    if cfg.trainer.precision == "fp8" and not float8_linears(model):
        raise ConfigError(
            f"trainer.precision=fp8 found no linear layer in model.layers whose sizes are multiples of {FLOAT8_MULTIPLE} "
            "(float8 matmuls need them): choose model.dim, model.mlp_hidden and the head sizes as multiples of 16, or pass trainer.precision=bf16"
        )
    model = parallel.apply(model, state, cfg.model, cfg.trainer.precision, compile=per_block)
    attention = choose_attention_precision(
        model,
        cfg.trainer.attention_precision,
        step_autocast(cfg, state),
        state.device,
        cfg.trainer.batch_size,
        getattr(data, "seq_len", None),
        state.world_size,
    )
    # The optimizer sees the parallelized model (FSDP's sharded parameters); ZeRO-1 then wraps it.
    optimizer = parallel.wrap_optimizer(build(cfg.optimizer, exclude=["schedule"], model=model), state)
    scheduler = build_scheduler(optimizer, cfg.optimizer.schedule, cfg.trainer.max_steps)
    default = default_loss(data_ignore_index(data))  # the adapter's ignore_index (padding), else -100
    loss_fn = compile_loss(default) if per_block else default
    pipeline = parallel.build_pipeline(model, state, cfg.model, loss_fn, cfg.trainer.grad_accum)
    forward_loss = compile_forward_loss(model, loss_fn, data) if whole else model_loss(model, loss_fn, data)
    module = parallel.unwrap(model, state)
    return Components(
        cfg, state, data, model, optimizer, scheduler, module, forward_loss, loss_fn, pipeline, task_loss(model, loss_fn, data), attention=attention
    )


@contextlib.contextmanager
def parallel_session(cfg: DictConfig) -> Iterator[ParallelState]:
    """This process's place in the job (process groups, mesh, device) for as long as the block runs."""
    parallel = build(cfg.parallel)
    state = parallel.setup(cfg.trainer.device, cfg.trainer.precision)
    try:
        yield state
    finally:
        parallel.teardown()
