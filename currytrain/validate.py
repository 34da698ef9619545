"""Eager validation of a composed config: every problem at once, each naming its key and a fix.

Each option's own checks live beside its config dataclass (a static `check(node, path) -> list[str]`);
validate() walks the composed tree, runs the checks of every typed node (each class of its schema that
defines one), rejects keys no schema declares and `_target_`s outside the allowed modules, and adds the
rules that span groups. It runs as a Hydra callback before the run folder exists, so a rejected config
writes nothing; the error it raises becomes exit code 2 in launch.py.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from currytrain.build import target_problems
from currytrain.data.config import BYTE_VOCAB, DigitsConfig, TabularConfig
from currytrain.errors import ConfigError, ConfigRejected
from currytrain.model.config import DecoderConfig, MLPConfig
from currytrain.optim.config import AdamWConfig
from currytrain.parallel.config import ParallelConfig
from currytrain.parallel.dims import ParallelDims, launched_world_size
from currytrain.weights import architecture_mismatch, model_node_of, resume_checkpoint, safetensors_problem


def schema_of(node: DictConfig) -> type | None:
    node_type = OmegaConf.get_type(node)
    return node_type if dataclasses.is_dataclass(node_type) else None


def _is(node: DictConfig, schema: type) -> bool:
    node_type = schema_of(node)
    return node_type is not None and issubclass(node_type, schema)


def _unknown_keys(node: DictConfig, schema: type, path: str) -> list[str]:
    """Keys a `+key=value` override added that no field of the schema declares (they would be ignored)."""
    known = [f.name for f in dataclasses.fields(schema)]
    problems = []
    for key in node.keys():
        if key in known or (not path and key == "hydra"):
            continue
        where = f"{path}.{key}" if path else str(key)
        near = difflib.get_close_matches(str(key), known, n=1)
        fix = f"did you mean {path + '.' if path else ''}{near[0]}?" if near else f"valid keys: {sorted(k for k in known if not k.startswith('_'))}"
        problems.append(f"{where} is not a field of {schema.__name__}, so it would be ignored: remove it; {fix}")
    return problems


def check_tree(node: DictConfig, path: str = "") -> list[str]:
    """The own checks and unknown keys of every typed node in the subtree, parents before children."""
    problems: list[str] = []
    schema = schema_of(node)
    if schema is not None:
        problems += _unknown_keys(node, schema, path)
        for klass in reversed(schema.__mro__):
            if isinstance(vars(klass).get("check"), staticmethod):  # not RootConfig's `check` group field
                problems += klass.check(node, path)
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not (not path and key == "hydra"):
            problems += check_tree(child, f"{path}.{key}" if path else str(key))
    return problems


# ------------------------------------------------------------------------------------------ across groups


def _data_vocab(data: DictConfig) -> tuple[int | None, str]:
    """(token ids the data can hold, what they come from); None when the tokenizer is unreadable (its own check says why)."""
    if "tokenizer" in data:
        from currytrain.data.tokenizer import tokenizer_vocab_size

        return tokenizer_vocab_size(data.tokenizer)[0], f"the vocabulary of data.tokenizer={data.tokenizer}"
    return (data.vocab_size if "vocab_size" in data else BYTE_VOCAB), "the data's vocabulary"


def _check_model_and_data(cfg: DictConfig) -> list[str]:
    data, model, problems = cfg.data, cfg.model, []
    if "max_seq_len" in model and "seq_len" in data and data.seq_len > model.max_seq_len >= 1:
        problems.append(
            f"data.seq_len={data.seq_len} exceeds model.max_seq_len={model.max_seq_len}: pass data.seq_len={model.max_seq_len} or raise model.max_seq_len"
        )
    data_vocab, source = _data_vocab(data)
    if "vocab_size" in model and data_vocab is not None and data_vocab > model.vocab_size:
        problems.append(f"model.vocab_size={model.vocab_size} is smaller than {source} ({data_vocab}): pass model.vocab_size={data_vocab}")
    # muP's per-layer rules here are Adam's.
    if model.get("mup", False) and not _is(cfg.optimizer, AdamWConfig):
        problems.append(
            f"model.mup=true sets Adam's per-layer learning rates, but optimizer builds {cfg.optimizer._target_}: pass optimizer=adamw, or model.mup=false"
        )
    return problems


DIGITS_SHAPE = (64, 10)
"""Features and classes of data=digits (scikit-learn's 8x8 images)."""


def _check_tables(cfg: DictConfig) -> list[str]:
    """Rows of features (data=digits|table) go to a classifier of feature vectors, token sequences to a decoder."""
    data, model = cfg.data, cfg.model
    if _is(data, TabularConfig) and _is(model, DecoderConfig):
        return [f"data builds {data._target_}, rows of features, but model builds {model._target_}, a decoder of token sequences: pass model=mlp ~model/size"]
    if _is(model, MLPConfig) and not _is(data, TabularConfig):
        return [f"model=mlp classifies rows of features, but data builds {data._target_}, token sequences: pass data=digits, or data=table data.path=<table>"]
    problems = []
    if _is(data, DigitsConfig) and _is(model, MLPConfig):
        features, classes = DIGITS_SHAPE
        if model.in_features != features:
            problems.append(f"model.in_features={model.in_features} but data=digits rows hold {features} features: pass model.in_features={features}")
        if model.num_classes < classes:
            problems.append(f"model.num_classes={model.num_classes} but data=digits has {classes} classes: pass model.num_classes={classes}")
    return problems


def _check_schedule(cfg: DictConfig) -> list[str]:
    warmup, max_steps = cfg.optimizer.schedule.warmup_steps, cfg.trainer.max_steps
    if max_steps >= 1 and warmup >= max_steps:
        return [
            f"optimizer.schedule.warmup_steps={warmup} is not below trainer.max_steps={max_steps}: pass optimizer.schedule.warmup_steps={max(0, max_steps // 10)}"
        ]
    return []


def _model_problem(node: dict[str, Any] | None, cfg: DictConfig) -> str | None:
    return node and architecture_mismatch(node, OmegaConf.to_container(cfg.model, resolve=True))


def _check_init_from(cfg: DictConfig) -> list[str]:
    init_from = cfg.trainer.init_from
    if init_from == "none":
        return []
    node = model_node_of(init_from) if Path(init_from).expanduser().exists() else None
    if node is None:
        return [f"trainer.init_from={init_from} is not an import folder (currytrain hf import), a run folder or a checkpoint: pass one of those"]
    weights = Path(init_from).expanduser() / "model.safetensors"
    if weights.is_file() and (broken := safetensors_problem(weights)):
        return [f"trainer.init_from={init_from}: {broken}"]
    problem = _model_problem(node, cfg)
    return [f"trainer.init_from={init_from} {problem}"] if problem else []


def _check_run_dir(cfg: DictConfig, run_dir: str | None) -> list[str]:
    """Never train over an earlier run's checkpoints unless asked to resume them; resume only what fits."""
    resume = cfg.trainer.resume
    if run_dir is not None and resume == "none":
        checkpoints = Path(run_dir) / "checkpoints"
        if checkpoints.is_dir() and any(checkpoints.iterdir()):
            return [
                f"{run_dir} already holds checkpoints of an earlier run: pass trainer.resume=auto to continue it, "
                "or choose another run folder (hydra.run.dir, or hydra.sweep.dir for -m)"
            ]
        return []
    checkpoint = resume_checkpoint(resume, run_dir)
    if checkpoint is None:
        if resume not in ("none", "auto"):  # auto with nothing saved yet starts fresh
            return [f"trainer.resume={resume} holds no complete checkpoint: pass trainer.resume=auto, or a run folder or checkpoint that has one"]
        return []
    problem = _model_problem(model_node_of(checkpoint), cfg)
    return [f"trainer.resume={resume} ({checkpoint}) {problem}"] if problem else []


def _check_rollback(cfg: DictConfig) -> list[str]:
    if cfg.abort.get("action") == "rollback" and cfg.trainer.checkpoint_every < 1:
        return [
            "abort.action=rollback restores the last good checkpoint, but trainer.checkpoint_every=0 saves only at the end: pass trainer.checkpoint_every=<steps>, or abort.action=stop"
        ]
    return []


def _check_batch_split(cfg: DictConfig) -> list[str]:
    """The dp ranks split each global batch evenly (degrees that do not fit the world are reported by the parallel check)."""
    if not _is(cfg.parallel, ParallelConfig) or cfg.parallel.nproc < 1:
        return []
    world = launched_world_size(cfg.parallel.nproc)
    if ParallelDims.problems(cfg.parallel, "parallel", world):
        return []
    dp = ParallelDims.resolve(cfg.parallel, world).dp_size
    batch = cfg.trainer.batch_size
    if batch >= 1 and batch % dp:
        return [
            f"trainer.batch_size={batch} (the global batch) does not split evenly over {dp} data-parallel ranks: pass trainer.batch_size={max(dp, batch // dp * dp)}"
        ]
    return []


def _check_memory(cfg: DictConfig) -> list[str]:
    """Refuse a run that cannot fit, with the estimate (currytrain/estimate.py) and what to change."""
    from currytrain.estimate import GiB, device_memory, estimate_memory

    estimate = estimate_memory(cfg)
    available, where = device_memory(cfg.trainer.device)
    if estimate.total <= available:
        return []
    return [
        f"the run needs about {estimate.describe()}, more than {where} holds ({available / GiB:,.1f} GiB): "
        "lower model.dim / model.n_layers / model.mlp_hidden (or model/size), lower trainer.batch_size "
        "(raise trainer.grad_accum to keep the batch), or set model.ac=full"
    ]


def _check_fabric_precision(cfg: DictConfig) -> list[str]:
    """Fabric's fp16 scales the loss inside fabric.backward, which the step's clipping and finiteness check
    would read unscaled: curryTrain's own runtime has the GradScaler path."""
    if _is(cfg.parallel, ParallelConfig) and cfg.parallel.runtime == "fabric" and cfg.trainer.precision == "fp16":
        return [
            "trainer.precision=fp16 with parallel.runtime=fabric is not supported: pass trainer.precision=bf16, or parallel.runtime=torch (fp16 with a GradScaler)"
        ]
    return []


def _check_loggers(cfg: DictConfig) -> list[str]:
    return [] if cfg.logger else ["logger is empty: pass logger=[tensorboard,jsonl] (or at least one logger)"]


CROSS_GROUP_CHECKS = (_check_model_and_data, _check_schedule, _check_init_from, _check_rollback, _check_batch_split, _check_fabric_precision, _check_loggers)


def validate(cfg: DictConfig, run_dir: str | None = None) -> list[str]:
    """All problems of a composed config (empty when it is good)."""
    try:
        task = OmegaConf.masked_copy(cfg, [key for key in cfg.keys() if key != "hydra"]) if "hydra" in cfg else cfg
        if mismatch := _check_tables(cfg):  # alone: the other checks read fields (data.seq_len) one side lacks
            return mismatch
        problems = target_problems(task, extra=cfg.build.allow)
        problems += check_tree(cfg)
        for check in CROSS_GROUP_CHECKS:
            problems += check(cfg)
        problems += _check_run_dir(cfg, run_dir)
        # Sizing builds the model on the meta device: only once every value it reads is known good.
        return problems or _check_memory(cfg)
    except OmegaConfBaseException as error:  # an interpolation that cannot resolve, a missing value
        return [f"the config cannot be read: {error}"]


def format_problems(problems: list[str]) -> str:
    noun = "problem" if len(problems) == 1 else "problems"
    lines = [f"curryTrain: the config has {len(problems)} {noun}:"]
    lines += [f"  - {problem}" for problem in problems]
    return "\n".join(lines)


def raise_on_problems(problems: list[str]) -> None:
    if problems:
        raise ConfigError(format_problems(problems))


class ValidateCallback(Callback):
    """Hydra callback: reject a bad config before Hydra creates the run folder (ConfigRejected escapes
    Hydra's handling of callback errors, which would only warn)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._reject(validate(config, OmegaConf.select(config, "hydra.run.dir")))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._reject(validate(config))

    @staticmethod
    def _reject(problems: list[str]) -> None:
        if problems:
            raise ConfigRejected(ConfigError(format_problems(problems)))
