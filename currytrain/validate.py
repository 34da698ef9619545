"""Eager validation of a composed config: every problem at once, each naming its key and a fix.

Runs as a Hydra callback before the run folder exists, so a rejected config writes nothing;
launch.py turns the error into one message and exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from currytrain.data.config import BYTE_VOCAB, SyntheticConfig, TextConfig
from currytrain.data.files import find_text_files, plan_split, planned_sizes
from currytrain.errors import EXIT_CONFIG_ERROR, ConfigError
from currytrain.model.config import AC_MODES, AC_POLICIES, MOE_GATINGS, SPIKE_RESETS, SPIKE_SURROGATES, GQAConfig, MoEConfig, SpikingConfig
from currytrain.optim.config import SCHEDULE_KINDS, AdamWConfig, SGDConfig
from currytrain.parallel.config import SingleConfig
from currytrain.weights import architecture_mismatch, find_checkpoint, model_node_of

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_model(model: DictConfig, problems: list[str]) -> None:
    for key in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden", "max_seq_len"):
        if key in model and model[key] < 1:
            problems.append(f"model.{key}={model[key]} must be >= 1: pass model.{key}=<positive int>")
    for key, fix in (("init_std", "0.02"), ("norm_eps", "1e-5")):
        if key in model and model[key] <= 0:
            problems.append(f"model.{key}={model[key]} must be > 0: pass model.{key}={fix}")
    _check_ac_and_mup(model, problems)
    if "n_heads" not in model or model.n_heads < 1 or model.n_kv_heads < 1 or model.dim < 1:
        return
    if model.dim % model.n_heads:
        problems.append(f"model.n_heads={model.n_heads} does not divide model.dim={model.dim}: choose model.n_heads in {_divisors(model.dim)[:12]}")
    if model.n_heads % model.n_kv_heads:
        problems.append(
            f"model.n_kv_heads={model.n_kv_heads} does not divide model.n_heads={model.n_heads}: choose model.n_kv_heads in {_divisors(model.n_heads)}"
        )


def _check_rope(model: DictConfig, problems: list[str]) -> None:
    if model.rope_theta <= 0:
        problems.append(f"model.rope_theta={model.rope_theta} must be > 0: pass model.rope_theta=10000")
    if model.n_heads >= 1 and model.dim % model.n_heads == 0 and (model.dim // model.n_heads) % 2:
        problems.append(f"model.dim/model.n_heads={model.dim // model.n_heads} is odd, RoPE needs an even head size: change model.dim or model.n_heads")


def _check_ac_and_mup(model: DictConfig, problems: list[str]) -> None:
    if "ac" in model and model.ac not in AC_MODES:
        problems.append(f"model.ac={model.ac} is not one of {list(AC_MODES)}: pass model.ac=full (or none, selective)")
    if "ac_policy" in model and model.ac_policy not in AC_POLICIES:
        problems.append(f"model.ac_policy={model.ac_policy} is not one of {list(AC_POLICIES)}: pass model.ac_policy=block (or op)")
    if "ac_every" in model and model.ac_every < 1:
        problems.append(f"model.ac_every={model.ac_every} must be >= 1 (checkpoint every k-th block): pass model.ac_every=2")
    if "mup_base_width" in model and model.mup_base_width < 1:
        problems.append(
            f"model.mup_base_width={model.mup_base_width} must be >= 1: pass the model.dim hyperparameters were tuned at, "
            f"e.g. model.mup_base_width={max(1, model.get('dim', 128))}"
        )


def _check_mup_optimizer(cfg: DictConfig, problems: list[str]) -> None:
    # Adam-family optimizers are the ones with betas; muP's per-layer rules here are Adam's.
    if cfg.model.get("mup", False) and not _is(cfg.optimizer, AdamWConfig):
        problems.append(
            f"model.mup=true sets Adam's per-layer learning rates, but optimizer builds {cfg.optimizer._target_}: pass optimizer=adamw, or model.mup=false"
        )


def _check_moe(model: DictConfig, problems: list[str]) -> None:
    """Routing fields of model=moe (present exactly when the model has routed experts)."""
    for key in ("num_experts", "top_k", "expert_hidden"):
        if model[key] < 1:
            problems.append(f"model.{key}={model[key]} must be >= 1: pass model.{key}=<positive int>")
    if model.num_experts >= 1 and not 1 <= model.top_k <= model.num_experts:
        problems.append(f"model.top_k={model.top_k} must be in [1, model.num_experts={model.num_experts}]: pass model.top_k={min(2, model.num_experts)}")
    if model.gating not in MOE_GATINGS:
        problems.append(f"model.gating={model.gating} is not one of {list(MOE_GATINGS)}: pass model.gating=softmax")
    if model.capacity_factor < 0:
        problems.append(f"model.capacity_factor={model.capacity_factor} must be >= 0 (0 is dropless): pass model.capacity_factor=1.25 or 0")
    for key in ("aux_loss_coef", "z_loss_coef"):
        if model[key] < 0:
            problems.append(f"model.{key}={model[key]} must be >= 0 (0 disables it): pass model.{key}=0")


def _check_spiking(model: DictConfig, problems: list[str]) -> None:
    """The LIF neuron fields of model=spiking."""
    if model.timesteps < 1:
        problems.append(f"model.timesteps={model.timesteps} must be >= 1: pass model.timesteps=4")
    if model.tau < 1:
        problems.append(f"model.tau={model.tau} must be >= 1 (timesteps; 1 keeps no memory): pass model.tau=2.0")
    if model.threshold <= 0:
        problems.append(f"model.threshold={model.threshold} must be > 0: pass model.threshold=1.0")
    if model.reset not in SPIKE_RESETS:
        problems.append(f"model.reset={model.reset} is not one of {list(SPIKE_RESETS)}: pass model.reset=soft")
    if model.surrogate not in SPIKE_SURROGATES:
        problems.append(f"model.surrogate={model.surrogate} is not one of {list(SPIKE_SURROGATES)}: pass model.surrogate=sigmoid")
    if model.surrogate_slope <= 0:
        problems.append(f"model.surrogate_slope={model.surrogate_slope} must be > 0: pass model.surrogate_slope=4.0")


def _check_data(cfg: DictConfig, problems: list[str]) -> None:
    data, model = cfg.data, cfg.model
    if data.seq_len < 1:
        problems.append(f"data.seq_len={data.seq_len} must be >= 1: pass data.seq_len=<positive int>")
    elif "max_seq_len" in model and data.seq_len > model.max_seq_len:
        problems.append(
            f"data.seq_len={data.seq_len} exceeds model.max_seq_len={model.max_seq_len}: pass data.seq_len={model.max_seq_len} or raise model.max_seq_len"
        )
    if "val_fraction" in data and not 0 < data.val_fraction < 1:
        problems.append(f"data.val_fraction={data.val_fraction} must be in (0, 1): pass data.val_fraction=0.1")
    data_vocab = data.vocab_size if "vocab_size" in data else BYTE_VOCAB
    if "vocab_size" in model and data_vocab > model.vocab_size:
        problems.append(f"model.vocab_size={model.vocab_size} is smaller than the data's vocabulary ({data_vocab}): pass model.vocab_size={data_vocab}")
    if "max_bytes" in data and data.max_bytes < 0:
        problems.append(f"data.max_bytes={data.max_bytes} must be >= 0 (0 reads everything): pass data.max_bytes=0")
    if _is(data, TextConfig):
        files, path_problems = find_text_files(data.paths, data.suffixes)
        problems.extend(path_problems)
        if files and not path_problems and 0 < data.val_fraction < 1 and data.max_bytes >= 0:
            train, val = planned_sizes(plan_split(files, data.val_fraction, data.max_bytes, data.seed))
            if min(train, val) <= data.seq_len + 1:
                problems.append(
                    f"data.paths hold {train} train / {val} val bytes, too few for data.seq_len={data.seq_len} "
                    "(each split needs more than one sequence): add text, lower data.seq_len or change data.val_fraction"
                )
    if _is(data, SyntheticConfig):
        if data.vocab_size < 1:
            problems.append(f"data.vocab_size={data.vocab_size} must be >= 1: pass data.vocab_size=256")
        if data.num_tokens <= data.seq_len + 1:
            problems.append(f"data.num_tokens={data.num_tokens} must exceed data.seq_len + 1 = {data.seq_len + 1}: pass data.num_tokens=1000000")


def _check_optimizer(opt: DictConfig, problems: list[str]) -> None:
    if opt.lr <= 0:
        problems.append(f"optimizer.lr={opt.lr} must be > 0: pass e.g. optimizer.lr=3e-4")
    if opt.weight_decay < 0:
        problems.append(f"optimizer.weight_decay={opt.weight_decay} must be >= 0: pass optimizer.weight_decay=0.1")
    if _is(opt, AdamWConfig):
        if len(opt.betas) != 2 or not all(0 <= b < 1 for b in opt.betas):
            problems.append(f"optimizer.betas={list(opt.betas)} must be two numbers in [0, 1): pass optimizer.betas=[0.9,0.95]")
        if opt.eps <= 0:
            problems.append(f"optimizer.eps={opt.eps} must be > 0: pass optimizer.eps=1e-8")
    if _is(opt, SGDConfig):
        if not 0 <= opt.momentum < 1:
            problems.append(f"optimizer.momentum={opt.momentum} must be in [0, 1): pass optimizer.momentum=0.9")
        elif opt.nesterov and opt.momentum == 0:
            problems.append("optimizer.nesterov=true needs momentum, but optimizer.momentum=0: pass optimizer.nesterov=false or optimizer.momentum=0.9")
    schedule = opt.schedule
    if schedule.kind not in SCHEDULE_KINDS:
        problems.append(f"optimizer.schedule.kind={schedule.kind} is not one of {list(SCHEDULE_KINDS)}: pass optimizer.schedule.kind=cosine")
    if schedule.warmup_steps < 0:
        problems.append(f"optimizer.schedule.warmup_steps={schedule.warmup_steps} must be >= 0")
    if not 0 <= schedule.min_lr_ratio <= 1:
        problems.append(f"optimizer.schedule.min_lr_ratio={schedule.min_lr_ratio} must be in [0, 1]: pass optimizer.schedule.min_lr_ratio=0.1")


def _check_trainer(trainer: DictConfig, schedule: DictConfig, problems: list[str]) -> None:
    for key in ("max_steps", "batch_size", "grad_accum", "eval_every", "eval_batches", "log_every", "keep_last"):
        if trainer[key] < 1:
            problems.append(f"trainer.{key}={trainer[key]} must be >= 1: pass trainer.{key}=<positive int>")
    if trainer.grad_clip < 0:
        problems.append(f"trainer.grad_clip={trainer.grad_clip} must be >= 0 (0 disables clipping): pass trainer.grad_clip=1.0")
    if trainer.checkpoint_every < 0:
        problems.append(f"trainer.checkpoint_every={trainer.checkpoint_every} must be >= 0 (0 saves only at the end)")
    if trainer.max_steps >= 1 and schedule.warmup_steps >= trainer.max_steps:
        problems.append(
            f"optimizer.schedule.warmup_steps={schedule.warmup_steps} is not below trainer.max_steps={trainer.max_steps}: "
            f"pass optimizer.schedule.warmup_steps={max(0, trainer.max_steps // 10)}"
        )
    if trainer.device not in DEVICES:
        problems.append(f"trainer.device={trainer.device} is not one of {list(DEVICES)}: pass trainer.device=auto")
    elif trainer.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            problems.append("trainer.device=cuda but no CUDA device is visible: pass trainer.device=auto (or cpu)")
    if trainer.precision not in PRECISIONS:
        problems.append(f"trainer.precision={trainer.precision} is not one of {list(PRECISIONS)}: pass trainer.precision=fp32")


def _check_init_from(cfg: DictConfig, problems: list[str]) -> None:
    init_from = cfg.trainer.init_from
    if init_from == "none":
        return
    node = model_node_of(init_from) if Path(init_from).expanduser().exists() else None
    if node is None:
        problems.append(f"trainer.init_from={init_from} is not an import folder (currytrain hf import), a run folder or a checkpoint: pass one of those")
    elif problem := architecture_mismatch(node, OmegaConf.to_container(cfg.model, resolve=True)):
        problems.append(f"trainer.init_from={init_from} {problem}")


def _check_parallel(cfg: DictConfig, problems: list[str]) -> None:
    if cfg.parallel.nproc < 1:
        problems.append(f"parallel.nproc={cfg.parallel.nproc} must be >= 1")
    elif _is(cfg.parallel, SingleConfig) and cfg.parallel.nproc != 1:
        problems.append(f"parallel.nproc={cfg.parallel.nproc} needs a multi-process strategy; parallel=single runs one process: pass parallel.nproc=1")


def _check_run_dir(cfg: DictConfig, run_dir: str | None, problems: list[str]) -> None:
    """Never train over an earlier run's checkpoints unless asked to resume them; resume only what fits."""
    resume = cfg.trainer.resume
    if run_dir is not None and resume == "none":
        checkpoints = Path(run_dir) / "checkpoints"
        if checkpoints.is_dir() and any(checkpoints.iterdir()):
            problems.append(
                f"{run_dir} already holds checkpoints of an earlier run: pass trainer.resume=auto to continue it, "
                "or choose another run folder (hydra.run.dir, or hydra.sweep.dir for -m)"
            )
        return
    if resume == "none" or (resume == "auto" and run_dir is None):
        return
    location = Path(run_dir if resume == "auto" else resume).expanduser()
    checkpoint = find_checkpoint(location)
    if checkpoint is None:
        if resume != "auto":  # auto with nothing saved yet starts fresh
            problems.append(f"trainer.resume={resume} holds no complete checkpoint: pass trainer.resume=auto, or a run folder or checkpoint that has one")
        return
    node = model_node_of(checkpoint)
    problem = node and architecture_mismatch(node, OmegaConf.to_container(cfg.model, resolve=True))
    if problem:
        problems.append(f"trainer.resume={resume} ({checkpoint}) {problem}")


def validate(cfg: DictConfig, run_dir: str | None = None) -> list[str]:
    """All problems of a composed config (empty when it is good)."""
    problems: list[str] = []
    try:
        _check_model(cfg.model, problems)
        for schema, checks in FAMILY_CHECKS.items():
            if _is(cfg.model, schema):
                for check in checks:
                    check(cfg.model, problems)
        _check_data(cfg, problems)
        _check_optimizer(cfg.optimizer, problems)
        _check_mup_optimizer(cfg, problems)
        _check_trainer(cfg.trainer, cfg.optimizer.schedule, problems)
        _check_init_from(cfg, problems)
        _check_parallel(cfg, problems)
        _check_run_dir(cfg, run_dir, problems)
        if not cfg.logger:
            problems.append("logger is empty: pass logger=[tensorboard,jsonl] (or at least one logger)")
    except OmegaConfBaseException as error:  # an interpolation that cannot resolve, a missing value
        problems.append(f"the config cannot be read: {error}")
    return problems


# Checks of one model family, selected by the schema the config was composed from.
FAMILY_CHECKS = {
    GQAConfig: (_check_rope,),
    MoEConfig: (_check_rope, _check_moe),
    SpikingConfig: (_check_spiking,),  # no RoPE: position comes from the causal mask
}


def _is(node: DictConfig, schema: type) -> bool:
    node_type = OmegaConf.get_type(node)
    return isinstance(node_type, type) and issubclass(node_type, schema)


def format_problems(problems: list[str]) -> str:
    noun = "problem" if len(problems) == 1 else "problems"
    lines = [f"curryTrain: the config has {len(problems)} {noun}:"]
    lines += [f"  - {problem}" for problem in problems]
    return "\n".join(lines)


def exit_on_problems(problems: list[str]) -> None:
    if problems:
        print(format_problems(problems), file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)


def raise_on_problems(problems: list[str]) -> None:
    if problems:
        raise ConfigError(format_problems(problems))


class ValidateCallback(Callback):
    """Hydra callback: reject a bad config before Hydra creates the run folder."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = OmegaConf.select(config, "hydra.run.dir")
        exit_on_problems(validate(config, run_dir))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        exit_on_problems(validate(config))
