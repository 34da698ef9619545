"""The training loop. Trainer.train() and train_step() read top to bottom; components are built
one per function from their own sub-tree of the (resolved) config."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from currytrain.build import build
from currytrain.checkpoint import Checkpointer, TrainState
from currytrain.errors import ConfigError
from currytrain.journal import Journal
from currytrain.logger.base import MultiLogger
from currytrain.model import build_model
from currytrain.model.hooks import HasTrainingMetrics
from currytrain.optim.builders import build_scheduler
from currytrain.parallel.state import ParallelState
from currytrain.trainer.progress import Progress
from currytrain.trainer.step import causal_lm_loss, run_accumulated_step
from currytrain.weights import architecture_mismatch, find_checkpoint

log = logging.getLogger(__name__)

PRECISION_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def build_loggers(logger_cfg: DictConfig, run_dir: Path, enabled: bool) -> MultiLogger:
    if not enabled:
        return MultiLogger([])
    return MultiLogger([build(node, run_dir=str(run_dir)) for node in logger_cfg.values()])


class Trainer:
    def __init__(self, cfg: DictConfig, run_dir: Path):
        self.cfg = cfg.trainer
        self.model_cfg = cfg.model
        self.run_dir = Path(run_dir)
        self.parallel = build(cfg.parallel)
        self.state: ParallelState = self.parallel.setup(self.cfg.device)
        torch.manual_seed(cfg.seed)
        self.data = build(cfg.data)
        self.model = self.parallel.apply(build_model(cfg.model), self.state, cfg.model)
        self.optimizer = build(cfg.optimizer, exclude=["schedule"], model=self.model)
        self.scheduler = build_scheduler(self.optimizer, cfg.optimizer.schedule, self.cfg.max_steps)
        self.train_state = TrainState(self.model, self.optimizer, self.scheduler)
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", self.cfg.keep_last, self.state.is_main)
        self.journal = Journal(self.run_dir / "journal.jsonl", enabled=self.state.is_main)
        self.loggers = build_loggers(cfg.logger, self.run_dir, enabled=self.state.is_main)
        self.loggers.log_config(OmegaConf.to_container(cfg, resolve=True))
        self.autocast_dtype = PRECISION_DTYPES[self.cfg.precision]
        self.tokens_per_step = self.cfg.batch_size * self.cfg.grad_accum * self.data.seq_len * self.state.dp_size

    @property
    def step(self) -> int:
        return self.train_state.step

    def train(self) -> float:
        """Run to trainer.max_steps (resuming first if asked) and return the final val loss."""
        if not self.maybe_resume():
            self.maybe_init_from()
        num_params = sum(p.numel() for p in self.model.parameters())
        self.journal.event("start", step=self.step, num_params=num_params, device=str(self.state.device), data=self.data.describe())
        log.info("model: %.2fM parameters on %s; %d tokens per step", num_params / 1e6, self.state.device, self.tokens_per_step)
        started = time.perf_counter()
        with Progress(self.cfg.max_steps, self.step, enabled=self.cfg.progress and self.state.is_main) as progress:
            while self.step < self.cfg.max_steps:
                metrics = self.train_step()
                progress.update(self.step, metrics["train/loss"], metrics["train/tokens_per_s"])
        val_loss = self.evaluate()
        seconds = time.perf_counter() - started
        self.journal.event("finish", step=self.step, val_loss=val_loss, seconds=round(seconds, 2))
        self.loggers.close()
        log.info("final val loss %.4f nats/token after %d steps (%.1f s)", val_loss, self.step, seconds)
        self.parallel.teardown()
        return val_loss

    def train_step(self) -> dict[str, float]:
        self.train_state.step += 1
        step, cfg = self.step, self.cfg
        tic = time.perf_counter()
        # 1. forward/backward over the microbatches, 2. clip, 3. finiteness check, 4. optimizer step
        microbatches = [self.data.batch("train", step, micro, cfg.batch_size, rank=self.state.dp_rank) for micro in range(cfg.grad_accum)]
        result = run_accumulated_step(
            self.model,
            self.optimizer,
            microbatches,
            loss_fn=causal_lm_loss,
            grad_clip=cfg.grad_clip,
            autocast_dtype=self.autocast_dtype,
        )
        if result.skipped:
            self.journal.event("skip_step", step=step, loss=result.loss, grad_norm=result.grad_norm)
        # 5. scheduler step
        lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        seconds = time.perf_counter() - tic
        metrics = {
            "train/loss": result.loss,
            "train/grad_norm": result.grad_norm,
            "train/lr": lr,
            "train/tokens_per_s": self.tokens_per_step / seconds,
            "train/step_seconds": seconds,
        }
        # 6. log
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            if isinstance(self.model, HasTrainingMetrics):
                metrics.update(self.model.training_metrics())
            self.loggers.log_metrics(metrics, step)
            # The journal keeps the curves too, so a run folder is comparable whatever loggers ran.
            self.journal.event("metrics", step=step, **metrics)
        if step % cfg.eval_every == 0 and step != cfg.max_steps:
            self.evaluate()
        # 7. checkpoint
        if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == cfg.max_steps:
            self.save_checkpoint()
        # 8. abort check: the abort group has only `none` so far.
        return metrics

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the same trainer.eval_batches val batches every time, so evals are comparable."""
        self.model.eval()
        losses = []
        for index in range(self.cfg.eval_batches):
            inputs, targets = self.data.batch("val", 0, index, self.cfg.batch_size, rank=self.state.dp_rank)
            inputs, targets = inputs.to(self.state.device), targets.to(self.state.device)
            with torch.autocast(self.state.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                losses.append(causal_lm_loss(self.model(inputs), targets).item())
        self.model.train()
        val_loss = sum(losses) / len(losses)
        self.loggers.log_metrics({"val/loss": val_loss, "val/bits_per_token": val_loss / math.log(2)}, self.step)
        self.journal.event("eval", step=self.step, val_loss=val_loss)
        log.info("step %d: val loss %.4f", self.step, val_loss)
        return val_loss

    def save_checkpoint(self) -> None:
        path = self.checkpointer.save(self.train_state)
        self.journal.event("checkpoint", step=self.step, path=str(path.relative_to(self.run_dir)))

    def maybe_resume(self) -> bool:
        """Load the checkpoint trainer.resume points at; True when the run continues from one."""
        resume = self.cfg.resume
        if resume == "none":
            return False
        location = self.run_dir if resume == "auto" else Path(resume).expanduser()
        path = find_checkpoint(location)
        if path is None:
            if resume == "auto":
                log.info("trainer.resume=auto: no complete checkpoint in %s, starting fresh", location)
                return False
            raise ConfigError(f"trainer.resume={resume} holds no complete checkpoint: pass trainer.resume=auto or a checkpoint folder")
        self.checkpointer.load(path, self.train_state)
        self.journal.event("resume", step=self.step, path=str(path))
        log.info("resumed from %s at step %d", path, self.step)
        return True

    def maybe_init_from(self) -> None:
        """Start from the weights trainer.init_from points at (an HF import, a run or a checkpoint)."""
        if self.cfg.init_from == "none":
            return
        from currytrain.hf.convert import read_model  # reads import folders through safetensors

        node, state, _ = read_model(self.cfg.init_from)
        problem = architecture_mismatch(node, self.model_cfg)
        if problem:  # validation catches this first; a folder changed since is caught here
            raise ConfigError(f"trainer.init_from={self.cfg.init_from} {problem}")
        if node.get("tie_embeddings"):
            state = {**state, "output.weight": state["tok_embeddings.weight"]}
        self.model.load_state_dict(state, strict=True)
        self.journal.event("init_from", path=str(self.cfg.init_from))
        log.info("initialised the model from %s", self.cfg.init_from)
