"""The training loop. Trainer.train() and train_step() read top to bottom; components are built
one per function from their own sub-tree of the (resolved) config."""

from __future__ import annotations

import logging
import math
import os
import signal
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from currytrain.build import build
from currytrain.checkpoint import Checkpointer, TrainState, metadata_problem
from currytrain.components import Components, build_components
from currytrain.data import HasEvalMetrics
from currytrain.errors import Aborted, ConfigError, Interrupted, Pruned, RunFailed
from currytrain.eval.loop import InLoopEvaluation
from currytrain.journal import Journal, read_journal
from currytrain.logger.base import MultiLogger, ending_status
from currytrain.model.protocol import HasTrainingMetrics, full
from currytrain.optim.builders import schedule_lambda
from currytrain.parallel.compile import (
    AUTO_PROBE_STEPS,
    DEFAULT_COMPILE_SECONDS,
    CompileChoice,
    choose_compile,
    compile_forward_loss,
    compile_report,
    compile_signature,
    compiles_whole,
    detect_vec_isa,
    record_compile_seconds,
    recorded_compile_seconds,
    use_compile_cache,
)
from currytrain.parallel.kernels import AttentionChoice
from currytrain.parallel.memory import optimizer_state_bytes, param_bytes
from currytrain.parallel.state import ParallelState, resolve_device
from currytrain.trainer.config import TrainerConfig, compiler_missing
from currytrain.trainer.heartbeat import Heartbeat
from currytrain.trainer.hooks import Action, Decision, StepHook, decide
from currytrain.trainer.progress import Progress
from currytrain.trainer.signals import StopSignals, handled_signals, stop_file_signal
from currytrain.trainer.step import DeviceStep, accumulated_step, fetch_steps
from currytrain.weights import checkpoint_candidates, checkpoint_problem, config_changes, marker_config

log = logging.getLogger(__name__)

# A step skipped for non-finite gradients still steps the schedule (the journal records the skip).
warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")


def build_loggers(logger_cfg: DictConfig, run_dir: Path, enabled: bool) -> MultiLogger:
    if not enabled:
        return MultiLogger([])
    return MultiLogger([build(node, run_dir=str(run_dir)) for node in logger_cfg.values()])


class Trainer:
    """One training run inside an open parallel session (see currytrain.components.parallel_session).

    state: this process's place in the job; by default one process on trainer.device.
    components: the parts to train, built by build_components(cfg, state) when not given.
    hooks: StepHooks asked after every step whether the run goes on (abort conditions, pruning, probes).
    """

    def __init__(
        self, cfg: DictConfig, run_dir: Path, state: ParallelState | None = None, *, components: Components | None = None, hooks: Sequence[StepHook] = ()
    ):
        # A plain dataclass, not the DictConfig node: the loop reads a dozen fields every step, and each read of
        # a DictConfig attribute costs ~30 us (1-2% of a tiny model's step on a 2-core CPU).
        self.cfg = TrainerConfig(**OmegaConf.to_container(cfg.trainer, resolve=True))
        self.model_cfg = cfg.model
        self.schedule_cfg = cfg.optimizer.schedule
        self.run_config = OmegaConf.to_container(cfg, resolve=True)
        self.run_dir = Path(run_dir)
        self.state = state or ParallelState(device=resolve_device(self.cfg.device))  # default: one process, no group
        if self.cfg.compile:
            use_compile_cache(self.cfg.compile_cache)
        self.isa_seconds = detect_vec_isa(self.state.device) if self.cfg.compile is True else 0.0
        parts = components or build_components(cfg, self.state)
        self.data, self.model, self.optimizer, self.scheduler = parts.data, parts.model, parts.optimizer, parts.scheduler
        self.module = parts.module  # the model with its own parameter names, for checkpoints and weight loading
        self.params = list(self.model.parameters())  # listed once: every step clips and checks them
        self.autocast_dtype, self.forward_loss, self.loss_fn = parts.autocast_dtype, parts.forward_loss, parts.loss_fn
        self.score = parts.score_sum  # the task loss eval adds up: the data's or the model's own loss() when there is one
        self.normalization = parts.normalization  # how a step counts its scored targets, over which ranks
        self.attention = parts.attention  # trainer.attention_precision's choice, journaled when the run starts
        self.pipeline = parts.pipeline  # pipeline parallelism: its schedule steps (and evaluates) this rank's stages
        # fp16 needs loss scaling (validation allows it on CUDA only); bf16 has fp32's range and needs none.
        self.scaler = torch.amp.GradScaler(self.state.device.type) if self.cfg.precision == "fp16" else None
        self.train_state = TrainState(self.module, self.optimizer, self.scheduler, rank=self.state.rank)
        model_node = OmegaConf.to_container(cfg.model, resolve=True)
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", self.cfg.keep_last, self.state.is_main, model_node, self.run_config)
        self.journal = Journal(self.run_dir / "journal.jsonl", enabled=self.state.is_main)
        self.loggers = build_loggers(cfg.logger, self.run_dir, enabled=self.state.is_main)
        self.loggers.log_config(self.run_config)
        self.hooks = list(hooks)
        # eval: held-out text sets and lm-eval tasks on the live model (currytrain/eval/loop.py); None with eval=none
        self.downstream = InLoopEvaluation.of(cfg, self.model, self.state, self.autocast_dtype, self.data.seq_len, self.run_dir, self.journal, self.loggers)
        # Where each rank is, for `currytrain diagnose` to name a straggler (the journal is rank 0's).
        self.heartbeat = Heartbeat(self.run_dir, self.state.rank, enabled=self.state.world_size > 1)
        self.memory_logged = False
        self.saved_step: int | None = None
        self.stop_signals = StopSignals()
        # trainer.batch_size is the global batch: the dp ranks split it, so this does not depend on their number.
        self.tokens_per_step = self.cfg.batch_size * self.cfg.grad_accum * self.data.seq_len
        self.pending: list[tuple[int, DeviceStep, float]] = []  # steps whose results are still on the device
        self.metrics: dict[str, float] = {}  # the latest fetched step's
        self.fetched_at = time.perf_counter()
        # trainer.compile: the step that compiles (the first; under auto, the one after the choice), whose fetch
        # journals the `compile` event; what the compiled graphs depend on, to record and look up their cost.
        self.compile_step: int | None = None
        self.auto_compile = self.cfg.compile == "auto"  # still to choose
        self.probe_from: int | None = None
        self.probe_started = 0.0
        setup = {"model": model_node, "precision": self.cfg.precision, "batch_size": self.cfg.batch_size, "grad_accum": self.cfg.grad_accum}
        self.compile_signature = compile_signature({**setup, "seq_len": self.data.seq_len, "device": self.state.device.type, "world": self.state.world_size})

    @property
    def step(self) -> int:
        return self.train_state.step

    def train(self) -> float:
        """Run to trainer.max_steps (resuming first if asked) and return the final val loss.

        Raises RunFailed when the final val loss is not finite, Aborted or Pruned when a hook stops the run;
        the loggers are closed on every path. The caller journals how the run ended (run_worker).
        """
        status = "failed"
        try:
            val_loss = self._train()
            status = "finished"
            return val_loss
        except BaseException as error:
            status = ending_status(error)  # the trackers show a pruned trial as pruned, not failed
            raise
        finally:
            self.loggers.close(status)
            self.heartbeat.close()

    def _train(self) -> float:
        if not self.maybe_resume():
            self.maybe_init_from()
        if self.downstream is not None:
            self.downstream.prepare()
        num_params = sum(p.numel() for p in self.model.parameters())
        self.journal.event("start", step=self.step, num_params=num_params, device=str(self.state.device), data=self.data.describe())
        if self.attention is not None:
            self.journal.event("attention_precision", step=self.step, **self.attention.event())
            log.info("attention kernel in %s: %s", "fp32" if self.attention.fp32 else self.cfg.precision, self.attention.reason)
        log.info("model: %.2fM parameters on %s; %d tokens per step", num_params / 1e6, self.state.device, self.tokens_per_step)
        if self.cfg.compile is True:
            self.compile_step = self.step + 1
        elif self.auto_compile:
            self.start_auto_compile()
        started = self.fetched_at = time.perf_counter()
        progress = Progress(self.cfg.max_steps, self.step, enabled=self.cfg.progress and self.state.is_main)
        with progress, self.stop_signals.installed(handled_signals(self.state.world_size)):
            while self.step < self.cfg.max_steps:
                metrics = self.train_step()
                progress.update(self.step, metrics["train/loss"], metrics["train/tokens_per_s"])
                if (signum := self.agreed_stop()) is not None:
                    self.stop_on_signal(signum)
        val_loss = self.evaluate()
        if self.downstream is not None:
            self.downstream.evaluate(self.step, final=True)
        seconds = time.perf_counter() - started
        if not math.isfinite(val_loss):
            raise RunFailed(
                f"the final val loss is {val_loss} after {self.step} steps: the run diverged. Lower optimizer.lr "
                "(or raise optimizer.schedule.warmup_steps, set trainer.grad_clip=1.0); the journal's metrics show where it began"
            )
        self.journal.event("finish", step=self.step, val_loss=val_loss, seconds=round(seconds, 2))
        log.info("final val loss %.4f nats/token after %d steps (%.1f s)", val_loss, self.step, seconds)
        return val_loss

    def train_step(self) -> dict[str, float]:
        """One optimizer step. Its loss and gradient norm stay on the device until a fetch step (a log, eval or
        checkpoint step, the first and the last), where the pending steps are read back together, so the
        device never waits for the host in between. Returns the latest fetched step's metrics."""
        self.train_state.step += 1
        self.train_state.tokens += self.tokens_per_step
        step, cfg = self.step, self.cfg
        # 1. forward/backward over the microbatches, 2. clip, 3. finiteness check, 4. optimizer step
        data_step = step + self.train_state.data_offset  # past the batches of rolled-back steps
        self.heartbeat.beat(step, "data")
        microbatches = [self.batch("train", data_step, micro) for micro in range(cfg.grad_accum)]
        self.heartbeat.beat(step, "compute")
        pending = accumulated_step(
            self.model,
            self.optimizer,
            microbatches,
            forward_loss=self.forward_loss,
            normalization=self.normalization,
            grad_clip=cfg.grad_clip,
            autocast_dtype=self.autocast_dtype,
            measure_grads=not self.memory_logged,
            scaler=self.scaler,
            backward=self.state.fabric.backward if self.state.fabric is not None else torch.Tensor.backward,
            loss_context=self.state.loss_context,
            pipeline=self.pipeline,
            parameters=self.params,
        )
        if self.auto_compile:
            self.probe_auto_compile(step)
        if not self.memory_logged:
            self.log_memory(pending.grad_bytes)
        # 5. scheduler step
        self.pending.append((step, pending, self.optimizer.param_groups[0]["lr"], self.train_state.tokens))
        self.scheduler.step()
        if self.metrics and not self.is_fetch_step(step):  # the first step of a run (or a resume) fetches
            self.heartbeat.beat(step, "done")
            return self.metrics
        # 6. fetch the pending steps; journal skips; log this step
        fetched = self.fetch_pending()
        metrics = self.metrics = fetched[-1]
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            if isinstance(self.module, HasTrainingMetrics):
                metrics.update(self.module.training_metrics())
            self.loggers.log_metrics(metrics, step)
            # The journal keeps the curves too, so a run folder is comparable whatever loggers ran.
            self.journal.event("metrics", step=step, **metrics)
        # 7. hooks on the earlier pending steps, in order: a fault found there acts before this step saves
        for earlier, earlier_metrics in zip(range(step - len(fetched) + 1, step), fetched[:-1]):
            decision = decide(self.hooks, earlier, earlier_metrics)
            if decision.action is not Action.CONTINUE:
                self.act_on(decision)
                self.heartbeat.beat(self.step, "done")
                return metrics
        if step % cfg.eval_every == 0 and step != cfg.max_steps:
            metrics["val/loss"] = self.evaluate()
        if self.downstream is not None and self.downstream.due(step) and step != cfg.max_steps:
            metrics.update(self.downstream.evaluate(step))
        # 8. checkpoint
        if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == cfg.max_steps:
            self.save_checkpoint()
        # 9. hooks: abort conditions, sweep pruning, ladder probes
        self.act_on(decide(self.hooks, step, metrics))
        self.heartbeat.beat(step, "done")
        return metrics

    def is_fetch_step(self, step: int) -> bool:
        cfg = self.cfg
        every = [cfg.log_every, cfg.eval_every] + ([cfg.checkpoint_every] if cfg.checkpoint_every else [])
        # compile=auto fetches the step before the compiled one too, so that the compile event times that step alone.
        compiling = self.compile_step is not None and step in (self.compile_step - 1, self.compile_step)
        return step == cfg.max_steps or compiling or any(step % n == 0 for n in every)

    def start_auto_compile(self) -> None:
        """trainer.compile=auto: choose eager at once where compiling cannot be had or cannot pay, else time
        AUTO_PROBE_STEPS eager steps after the first and choose then (probe_auto_compile)."""
        remaining = self.cfg.max_steps - self.step
        if not compiles_whole(self.state) or self.pipeline is not None:
            self.choose_compile(
                CompileChoice(
                    False,
                    "with parallelism the blocks compile when the model is built: trainer.compile=auto chooses on one process only; pass trainer.compile=true",
                )
            )
        elif self.state.device.type != "cuda" and compiler_missing():
            self.choose_compile(CompileChoice(False, "no C++ compiler ($CXX, else g++) for torch.compile's CPU kernels"))
        elif remaining <= 1 + AUTO_PROBE_STEPS:
            self.choose_compile(
                CompileChoice(False, f"{remaining} steps to run: too few to time eager steps and repay a compilation", {"remaining_steps": remaining})
            )
        else:
            self.probe_from = self.step + 2  # the first step warms up

    def probe_auto_compile(self, step: int) -> None:
        """Time AUTO_PROBE_STEPS eager steps (waiting for the device at both ends), then choose."""
        if step + 1 == self.probe_from or step == self.probe_from - 1 + AUTO_PROBE_STEPS:
            if self.state.device.type == "cuda":
                torch.cuda.synchronize(self.state.device)
            now = time.perf_counter()
            if step + 1 == self.probe_from:
                self.probe_started = now
                return
            cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            recorded = recorded_compile_seconds(Path(cache), self.compile_signature) if cache else None
            seconds = recorded if recorded is not None else DEFAULT_COMPILE_SECONDS
            eager = (now - self.probe_started) / AUTO_PROBE_STEPS
            self.choose_compile(choose_compile(eager, self.cfg.max_steps - step, seconds, measured=recorded is not None))

    def choose_compile(self, choice: CompileChoice) -> None:
        """Journal trainer.compile=auto's choice; when it compiles, the next step runs the compiled forward and loss."""
        self.auto_compile = False
        self.journal.event("compile_choice", step=self.step, **choice.event())
        log.info("trainer.compile=auto: %s (%s)", "compiling" if choice.compile else "eager", choice.reason)
        if choice.compile:
            self.isa_seconds = detect_vec_isa(self.state.device)
            self.forward_loss = compile_forward_loss(self.model, self.loss_fn, self.data)
            self.compile_step = self.step + 1

    def fetch_pending(self) -> list[dict[str, float]]:
        """Metrics of each step since the last fetch: one device-to-host copy, and one all-reduce of the losses
        (each rank's loss is over its slice; the mean over the dp ranks is the global batch's loss). The
        seconds since the last fetch are shared equally among its steps (the device runs ahead of the host)."""
        steps, pending, lrs, tokens = zip(*self.pending)
        self.pending.clear()
        results = fetch_steps(pending)
        losses = self.state.mean_over("loss", torch.tensor([result.loss for result in results], device=self.state.device)).tolist()
        now = time.perf_counter()
        seconds, self.fetched_at = (now - self.fetched_at) / len(steps), now
        if self.compile_step in steps:  # this step compiled the graphs
            report = compile_report(seconds, self.isa_seconds)
            self.journal.event("compile", step=self.compile_step, **report)
            if self.state.is_main and report["cache_dir"]:
                record_compile_seconds(Path(report["cache_dir"]), self.compile_signature, seconds + self.isa_seconds)
        metrics = []
        for step, result, loss, lr, seen in zip(steps, results, losses, lrs, tokens):
            if result.skipped:
                self.journal.event("skip_step", step=step, loss=loss, grad_norm=result.grad_norm)
            metrics.append(
                {
                    "train/loss": loss,
                    "train/grad_norm": result.grad_norm,
                    "train/lr": lr,
                    "train/tokens_per_s": self.tokens_per_step / seconds,
                    "train/step_seconds": seconds,
                    "train/skipped": float(result.skipped),
                    "train/tokens": float(self.tokens_per_step),
                    "train/tokens_seen": float(seen),
                }
            )
        return metrics

    def log_memory(self, grads: int | None) -> None:
        """Once per run, after its first step: every rank's bytes of parameters, gradients and optimizer
        state (what each strategy shards shows here), journaled by rank 0 and sent to the loggers."""
        mine = {"params": param_bytes(self.module), "grads": grads or 0, "optimizer": optimizer_state_bytes(self.optimizer)}
        ranks = self.state.gather(mine)
        self.journal.event("memory", step=self.step, ranks=ranks)
        self.loggers.log_metrics({f"memory/{key}_bytes": float(value) for key, value in mine.items()}, self.step)
        self.memory_logged = True

    def batch(self, split: str, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's slice of the global batch (trainer.batch_size sequences) of `step`."""
        inputs, targets = self.data.batch(split, step, micro, self.cfg.batch_size, rank=self.state.dp_rank, num_ranks=self.state.dp_size)
        return self.state.shard_sequence(inputs), self.state.shard_sequence(targets)  # context parallel: its share of positions

    def act_on(self, decision: Decision) -> None:
        if decision.action is Action.STOP:
            raise Aborted(f"step {self.step}: {decision.reason}")
        if decision.action is Action.PRUNE:
            raise Pruned(f"step {self.step}: {decision.reason}")
        if decision.action is Action.ROLLBACK:
            self.rollback(decision.reason, decision.lr_scale)

    def rollback(self, reason: str, lr_scale: float = 1.0) -> None:
        """Continue from the newest complete checkpoint of this run (an abort condition asked for it), on
        data the failed steps did not see, with every learning rate scaled by lr_scale."""
        path = self.intact_checkpoint(self.run_dir / "checkpoints")
        if path is None:
            raise Aborted(f"step {self.step}: {reason}; no complete checkpoint to roll back to (set trainer.checkpoint_every)")
        from_step = self.step
        self.checkpointer.load(path, self.train_state)
        if self.train_state.tokens is None:  # a checkpoint from before the count, in a run that never changed its batch
            self.train_state.tokens = self.step * self.tokens_per_step
        self.train_state.data_offset += from_step - self.step
        if lr_scale != 1.0:  # the schedule multiplies base_lrs, so that is where the scale must go
            self.scheduler.base_lrs = [lr * lr_scale for lr in self.scheduler.base_lrs]
            for group in self.optimizer.param_groups:
                group["lr"] *= lr_scale
        fields = {"from_step": from_step, "path": str(path), "reason": reason, "data_offset": self.train_state.data_offset, "lr_scale": lr_scale}
        self.journal.event("rollback", step=self.step, **fields)
        self.loggers.restarted(self.step)
        log.warning("rolled back from step %d to %s: %s", from_step, path, reason)

    @torch.no_grad()
    def evaluate(self) -> float:
        """The loss per scored target over the same trainer.eval_batches val batches every time (so evals are
        comparable): every batch's and rank's summed loss over their scored targets, however the set is batched."""
        self.model.eval()
        totals, counts, extra = [], [], []
        batches = [self.batch("val", 0, index) for index in range(self.cfg.eval_batches)]
        if self.pipeline is not None:  # forward only through the stages; every rank gets the last stage's sums
            totals = self.pipeline.eval_losses(batches, self.state.device, self.autocast_dtype)
            counts = [self.normalization.count(targets) for _, targets in batches]
        for inputs, targets in batches if self.pipeline is None else ():
            inputs, targets = inputs.to(self.state.device), targets.to(self.state.device)
            autocast = torch.autocast(self.state.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None)
            with self.state.loss_context(), autocast:
                logits = self.model(inputs)
                loss = self.score(logits, (inputs, targets))
                totals.append(full(loss.total).item())
                counts.append(float(loss.count))
            if isinstance(self.data, HasEvalMetrics):  # a classifier's accuracy, say
                extra.append(self.data.eval_metrics(logits, targets))
        self.model.train()
        total, count = self.state.sum_over("loss", torch.tensor([sum(totals), float(sum(counts))], dtype=torch.float64, device=self.state.device)).tolist()
        val_loss = total / count if count else math.nan
        means = {
            key: self.state.mean_over("loss", torch.tensor(sum(m[key] for m in extra) / len(extra), device=self.state.device)).item()
            for key in (extra[0] if extra else {})
        }
        self.loggers.log_metrics({"val/loss": val_loss, "val/bits_per_token": val_loss / math.log(2), **{f"val/{k}": v for k, v in means.items()}}, self.step)
        self.journal.event("eval", step=self.step, val_loss=val_loss, **means)
        log.info("step %d: val loss %.4f%s", self.step, val_loss, "".join(f", {key} {value:.4f}" for key, value in means.items()))
        return val_loss

    def save_checkpoint(self) -> Path:
        path = self.checkpointer.save(self.train_state)
        self.saved_step = self.step
        self.journal.event("checkpoint", step=self.step, path=str(path.relative_to(self.run_dir)))
        return path

    def agreed_stop(self) -> signal.Signals | None:
        """The stop signal the run stops on after this step, if any. One process: the one it received (no
        collective, no host sync). Several: only at fetch steps, where the ranks all-reduce (max) the signal
        each has seen, so that all stop after the same step (see currytrain.trainer.signals)."""
        if self.state.world_size == 1:
            return self.stop_signals.received
        if not self.is_fetch_step(self.step):
            return None
        mine = self.stop_signals.received or stop_file_signal()
        agreed = self.state.max_over_world(int(mine or 0))
        return signal.Signals(agreed) if agreed else None

    def stop_on_signal(self, signum) -> None:
        """A stop signal arrived during this step: save (unless this step just did, or
        trainer.checkpoint_on_signal=false), journal it and stop with exit code 128 + the signal."""
        path = None
        if self.cfg.checkpoint_on_signal:
            path = self.save_checkpoint() if self.saved_step != self.step else self.checkpointer.folder / f"step_{self.step}"
        saved = f"checkpoint {path.relative_to(self.run_dir)} saved" if path else "no checkpoint saved (trainer.checkpoint_on_signal=false)"
        self.journal.event("interrupted", step=self.step, signal=signum.name, checkpoint=str(path.relative_to(self.run_dir)) if path else None)
        raise Interrupted(f"stopped by {signum.name} after step {self.step}: {saved}. Continue with trainer.resume=auto (same run folder)", signum)

    def intact_checkpoint(self, location: Path) -> Path | None:
        """The newest checkpoint at `location` whose files match their checksums; each newer one that does
        not is journaled (checkpoint_corrupt) and passed over, with a warning."""
        for path in checkpoint_candidates(location):
            problem = checkpoint_problem(path) or metadata_problem(path)
            if problem is None:
                return path
            self.journal.event("checkpoint_corrupt", step=self.step, path=str(path), problem=problem)
            log.warning("checkpoint %s %s: not loading it, trying an earlier one", path, problem)
        return None

    def maybe_resume(self) -> bool:
        """Load the checkpoint trainer.resume points at (the newest intact one); True when the run continues from one."""
        if self.cfg.resume == "none":
            return False
        location = self.run_dir if self.cfg.resume == "auto" else Path(self.cfg.resume).expanduser()
        path = self.intact_checkpoint(location)
        if path is None:
            if checkpoint_candidates(location):
                raise ConfigError(
                    f"trainer.resume={self.cfg.resume}: no checkpoint in {location} passes its checksums and content checks (the journal's checkpoint_corrupt "
                    "events say why): restore them from a copy, or move them aside and start over in a new run folder"
                )
            if self.cfg.resume == "auto":
                log.info("trainer.resume=auto: no complete checkpoint in %s, starting fresh", self.run_dir)
                earlier = read_journal(self.journal.path) if self.journal.path.is_file() else []
                if any(record.get("type") in ("metrics", "eval") for record in earlier):
                    # an earlier attempt in this folder logged steps: this run replaces them, in the trackers and the readers
                    self.journal.event("restart", step=0, reason="no checkpoint to resume: the run starts again from step 0")
                    self.loggers.restarted(0)
                return False
            # validation catches this first; a folder emptied since is caught here
            raise ConfigError(f"trainer.resume={self.cfg.resume} holds no complete checkpoint: pass trainer.resume=auto or a checkpoint folder")
        saved = marker_config(path)
        changes = config_changes(saved, self.run_config) if saved is not None else {}
        if self.cfg.resume_mode == "weights":
            self.checkpointer.load_weights(path, self.train_state)
            self.scheduler.last_epoch = self.step
            self.schedule_from(self.step)
            fresh = {"optimizer": "fresh", "schedule": f"fresh: warmup and decay over steps {self.step + 1}-{self.cfg.max_steps}", "rng": "fresh"}
        else:
            hyperparameters = [{k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")} for group in self.optimizer.param_groups]
            self.checkpointer.load(path, self.train_state)
            self.apply_changes(changes, hyperparameters)
            fresh = {}
        self.keep_attention_choice(path)
        estimated = self.train_state.tokens is None
        if estimated:  # a checkpoint from before the count: as if its batch never changed
            before = (saved or {}).get("trainer", {})
            per_step = before.get("batch_size", self.cfg.batch_size) * before.get("grad_accum", self.cfg.grad_accum)
            self.train_state.tokens = self.step * per_step * (saved or {}).get("data", {}).get("seq_len", self.data.seq_len)
        position = {"tokens": self.train_state.tokens, "tokens_estimated": estimated, "next_data_step": self.step + self.train_state.data_offset + 1}
        self.journal.event("resume", step=self.step, path=str(path), mode=self.cfg.resume_mode, **position, **fresh)
        if saved is None:
            log.warning("the checkpoint %s records no config (saved before curryTrain kept it): changes since cannot be listed", path)
        elif changes:
            self.journal.event("changed_on_resume", step=self.step, changes=changes, tokens=self.train_state.tokens)
            for key, values in changes.items():
                log.warning("changed on resume: %s %s -> %s", key, values["checkpoint"], values["now"])
        self.loggers.restarted(self.step)  # the steps after the checkpoint run again: their new values win
        log.info("resumed from %s at step %d (%s, %d tokens seen)", path, self.step, self.cfg.resume_mode, self.train_state.tokens)
        return True

    def keep_attention_choice(self, checkpoint: Path) -> None:
        """Under trainer.attention_precision=auto a resumed run keeps the attention dtype its checkpoint trained with
        (the last choice its run's journal recorded up to that step), so that it continues with the same numbers
        whatever the timing says today."""
        journal = checkpoint.parent.parent / "journal.jsonl"  # <run>/checkpoints/step_<N>
        if self.attention is None or self.cfg.attention_precision != "auto" or not journal.is_file():
            return
        step = self.train_state.step
        earlier = [r for r in read_journal(journal) if r.get("type") == "attention_precision" and r.get("step", 0) <= step]
        if earlier and earlier[-1]["fp32"] != self.attention.fp32:
            reason = f"kept from the checkpoint's run ({earlier[-1]['reason']}); timed now: {self.attention.reason}"
            self.attention = AttentionChoice(earlier[-1]["fp32"], reason, self.attention.numbers).apply(self.model)

    def apply_changes(self, changes: dict[str, dict], hyperparameters: list[dict]) -> None:
        """After a full resume, what the config changed since the checkpoint and the loaded state would hide: the
        optimizer's hyperparameters (loaded with its state), the peak lr (kept in the schedule's base_lrs, scaled so
        that muP's per-group ratios and a rollback's scale are kept) and the lr of this step under a changed schedule."""
        if any(key.startswith("optimizer.") and not key.startswith("optimizer.schedule.") for key in changes):
            for group, values in zip(self.optimizer.param_groups, hyperparameters):
                group.update(values)
        if "optimizer.lr" in changes:
            ratio = changes["optimizer.lr"]["now"] / changes["optimizer.lr"]["checkpoint"]
            self.scheduler.base_lrs = [lr * ratio for lr in self.scheduler.base_lrs]
            for group in self.optimizer.param_groups:
                group["initial_lr"] = group.get("initial_lr", group["lr"]) * ratio
        schedule_changed = any(key == "optimizer.lr" or key.startswith("optimizer.schedule.") or key == "trainer.max_steps" for key in changes)
        if schedule_changed or self.train_state.schedule_start:
            self.schedule_from(self.train_state.schedule_start)

    def schedule_from(self, start: int) -> None:
        """The LR schedule as configured, begun at step `start` (0, or where a trainer.resume_mode=weights resume
        restarted it: warmup again, decay over the steps left to trainer.max_steps), and this step's lr under it."""
        multiplier = schedule_lambda(self.schedule_cfg, self.cfg.max_steps, start)
        self.train_state.schedule_start = start
        self.scheduler.lr_lambdas = [multiplier] * len(self.optimizer.param_groups)
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            group["lr"] = base * multiplier(self.scheduler.last_epoch)

    def maybe_init_from(self) -> None:
        """Start from the weights trainer.init_from points at (an HF import, a run or a checkpoint)."""
        if self.cfg.init_from == "none":
            return
        from currytrain.hf.convert import load_weights  # reads import folders through safetensors

        # Validation checks the architecture first; a folder changed since is caught here.
        model_cfg = OmegaConf.to_container(self.model_cfg, resolve=True)
        load_weights(self.module, self.cfg.init_from, model_cfg, what=f"trainer.init_from={self.cfg.init_from}")
        self.journal.event("init_from", path=str(self.cfg.init_from))
        log.info("initialised the model from %s", self.cfg.init_from)
