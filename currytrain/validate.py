"""Eager validation of a composed config: every problem at once, each naming its key and a fix.

A field's range is declared with the field (rules.bounded); each option's other checks live beside its config
dataclass (a static `check(node, path) -> list[str]`). validate() walks the composed tree, checks every typed
node's fields against their declarations (float fields finite), runs the checks of each class of its schema
that defines one, rejects keys no schema declares and `_target_`s outside the allowed modules, and adds the
rules that span groups. It runs as a Hydra callback before the run folder exists, so a rejected config
writes nothing; the error it raises becomes exit code 2 in launch.py.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from currytrain.build import target_problems
from currytrain.compose_errors import unknown_key_problem
from currytrain.data.base import BYTE_VOCAB, PROBE_SPECIAL_TOKENS
from currytrain.data.config import DigitsConfig, ProbeConfig, TabularConfig
from currytrain.errors import ConfigError, ConfigRejected, ValidationCrashed, format_problems
from currytrain.eval.config import EvalConfig
from currytrain.lock import acquire, held_by_another, holding
from currytrain.model.config import DecoderConfig, GQAConfig, MLPConfig, MoEConfig, RopeDecoderConfig
from currytrain.optim.config import AdamWConfig
from currytrain.parallel.config import ParallelConfig
from currytrain.parallel.dims import ParallelDims, launched_world_size
from currytrain.parallel.pipeline import SCHEDULES, even_split, microbatch_problem, stages_per_rank
from currytrain.rules import divisors, schema_problems
from currytrain.weights import (
    architecture_mismatch,
    checkpoint_step,
    model_node_of,
    optimizer_state_problems,
    resume_checkpoint,
    safetensors_problem,
    saved_config_of,
)


def schema_of(node: DictConfig) -> type | None:
    node_type = OmegaConf.get_type(node)
    return node_type if dataclasses.is_dataclass(node_type) else None


def _is(node: DictConfig, schema: type) -> bool:
    node_type = schema_of(node)
    return node_type is not None and issubclass(node_type, schema)


def _unknown_keys(node: DictConfig, schema: type, path: str) -> list[str]:
    """Keys a `+key=value` override added that no field of the schema declares (they would be ignored)."""
    known = {f.name for f in dataclasses.fields(schema)}
    unknown = [key for key in node.keys() if key not in known and not (not path and key == "hydra")]
    return [unknown_key_problem(f"{path}.{key}" if path else str(key), schema, value=_shown(node, key), added=True) for key in unknown]


def _shown(node: DictConfig, key: Any) -> Any:
    """A value as an override would write it (None when it cannot be read)."""
    try:
        value = node[key]
    except OmegaConfBaseException:
        return None
    return str(value).lower() if isinstance(value, bool) else value if not isinstance(value, DictConfig | ListConfig) else None


def check_tree(node: DictConfig, path: str = "") -> list[str]:
    """The unknown keys, declared ranges (rules.schema_problems) and own checks of every typed node in the
    subtree, parents before children."""
    problems: list[str] = []
    schema = schema_of(node)
    if schema is not None:
        declared = schema_problems(node, schema, path)
        problems += _unknown_keys(node, schema, path) + declared
        for klass in reversed(schema.__mro__):
            if isinstance(vars(klass).get("check"), staticmethod):  # not RootConfig's `check` group field
                try:
                    problems += klass.check(node, path)
                except (TypeError, ValueError, AttributeError, ArithmeticError):
                    if not declared:  # a bug of the check itself
                        raise  # else a value of the wrong kind tripped it, and `declared` names that value
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not (not path and key == "hydra"):
            problems += check_tree(child, f"{path}.{key}" if path else str(key))
    return problems


def argument_problems(node: Any, path: str = "", extra: Any = ()) -> list[str]:
    """Keys of untyped nodes (a `+logger.mine={_target_: ...}` no schema types) that the callable their _target_
    names does not take: build() would fail with a TypeError after the run started."""
    import inspect

    from hydra.utils import get_object

    from currytrain.build import target_problem

    problems: list[str] = []
    if isinstance(node, DictConfig) and schema_of(node) is None and "_target_" in node:
        target = node._get_node("_target_")._value()
        if target_problem(target, extra) is None:
            try:
                parameters = inspect.signature(get_object(target)).parameters.values()
            except (TypeError, ValueError):  # a builtin without a signature: build() says what it takes
                parameters = None
            if parameters is not None and not any(p.kind == p.VAR_KEYWORD for p in parameters):
                names = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
                for key in node.keys():
                    if not str(key).startswith("_") and key not in names:
                        problems.append(f"{path}.{key} is not an argument of {target}, so building it would fail: remove it; its arguments: {names}")
    if isinstance(node, DictConfig):
        for key in node.keys():
            problems += argument_problems(node._get_node(key), f"{path}.{key}" if path else str(key), extra)
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            problems += argument_problems(node._get_node(index), f"{path}[{index}]", extra)
    return problems


# ------------------------------------------------------------------------------------------ across groups


def _data_vocab(data: DictConfig) -> tuple[int | None, str]:
    """(token ids the data can hold, what they come from); None when the tokenizer is unreadable (its own check says why)."""
    if "tokenizer" in data:
        from currytrain.data.tokenizer import tokenizer_vocab_size

        return tokenizer_vocab_size(data.tokenizer)[0], f"the vocabulary of data.tokenizer={data.tokenizer}"
    if "num_symbols" in data and _is(data, ProbeConfig):  # the probe tasks' symbols follow their 3 special tokens
        return (
            PROBE_SPECIAL_TOKENS + data.num_symbols,
            f"the probe tasks' vocabulary ({PROBE_SPECIAL_TOKENS} special tokens + data.num_symbols={data.num_symbols})",
        )
    return (data.vocab_size if "vocab_size" in data else BYTE_VOCAB), "the data's vocabulary"


def take_vocab_from_tokenizer(cfg: DictConfig) -> None:
    """data=tokens: a model.vocab_size below the tokenizer's vocabulary (a model that could not score its ids; the
    sizes' default 256) becomes the tokenizer's, said in the log. Called right after composition, before validation,
    by every path that composes (ValidateCallback, a multirun's job, currytrain.config.compose_config)."""
    data, model = cfg.get("data"), cfg.get("model")
    if not isinstance(data, DictConfig) or "tokenizer" not in data or not isinstance(model, DictConfig) or "vocab_size" not in model:
        return
    try:
        vocab, _ = _data_vocab(data)
        small = vocab is not None and isinstance(model.vocab_size, int) and model.vocab_size < vocab
    except OmegaConfBaseException:  # an unreadable value: validation names it
        return
    if small:
        logging.getLogger(__name__).info("model.vocab_size=%d: the vocabulary of data.tokenizer=%s (not %d)", vocab, data.tokenizer, model.vocab_size)
        model.vocab_size = vocab


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
    if warmup is not None and max_steps >= 1 and warmup >= max_steps:  # null: a share of max_steps, always below
        return [
            f"optimizer.schedule.warmup_steps={warmup} is not below trainer.max_steps={max_steps}: pass optimizer.schedule.warmup_steps={max(0, max_steps // 10)}, or null (a share of the steps: optimizer.schedule.warmup_ratio)"
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


EARLIER_RUN = ("journal.jsonl", "resolved.yaml", "metrics.jsonl")
"""What an earlier run leaves in its folder (besides checkpoints): a new run there would replace or mix them."""


def _unwritable(run_dir: str) -> list[str]:
    """The run folder (or the nearest folder above it that exists) must be writable: a run writes only there."""
    import os

    existing = Path(run_dir).resolve()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return []
    why = "is not a folder" if existing.exists() and not existing.is_dir() else "cannot be written (read-only or not permitted)"
    return [f"hydra.run.dir={run_dir}: {existing} {why}: choose a run folder on a writable file system (hydra.run.dir, or hydra.sweep.dir for -m)"]


def _check_run_dir(cfg: DictConfig, run_dir: str | None) -> list[str]:
    """Never train over an earlier run's checkpoints unless asked to resume them; resume only what fits."""
    if run_dir is not None and (unwritable := _unwritable(run_dir)):
        return unwritable
    resume = cfg.trainer.resume
    if run_dir is not None and resume == "none":
        checkpoints = Path(run_dir) / "checkpoints"
        if checkpoints.is_dir() and any(checkpoints.iterdir()):
            return [
                f"{run_dir} already holds checkpoints of an earlier run: pass trainer.resume=auto to continue it, "
                "or choose another run folder (hydra.run.dir, or hydra.sweep.dir for -m)"
            ]
        earlier = [name for name in EARLIER_RUN if (Path(run_dir) / name).is_file()]
        if earlier:  # a run that saved no checkpoint (crashed, or trainer.checkpoint_every=0): its record would be replaced
            return [
                f"{run_dir} already holds an earlier run ({', '.join(earlier)}) and no checkpoint to resume: choose another run folder "
                "(hydra.run.dir, or hydra.sweep.dir for -m), or pass trainer.resume=auto to run it again from step 0 in this folder "
                "(its journal keeps the earlier attempt)"
            ]
        return []
    if resume == "latest":  # a run of this very experiment and config, found when the run starts (run.choose_resume)
        return []
    checkpoint = resume_checkpoint(resume, run_dir)
    if checkpoint is None:
        if resume not in ("none", "auto"):  # auto with nothing saved yet starts fresh
            return [f"trainer.resume={resume} holds no complete checkpoint: pass trainer.resume=auto, or a run folder or checkpoint that has one"]
        return []
    problem = _model_problem(model_node_of(checkpoint), cfg)
    if problem:
        return [f"trainer.resume={resume} ({checkpoint}) {problem}"]
    step = checkpoint_step(checkpoint)
    if resume != "auto" and step is not None and step >= cfg.trainer.max_steps:  # auto: a finished run relaunched, a no-op
        return [
            f"trainer.resume={resume} is at step {step}, so trainer.max_steps={cfg.trainer.max_steps} leaves nothing to train: pass trainer.max_steps=<more than {step}>"
        ]
    saved = saved_config_of(checkpoint)
    if cfg.trainer.resume_mode == "full" and saved is not None:  # what can be applied is, at the resume (Trainer.maybe_resume)
        return optimizer_state_problems(saved, {"optimizer": OmegaConf.to_container(cfg.optimizer, resolve=True)}, resume)
    return []


def _check_rollback(cfg: DictConfig) -> list[str]:
    if cfg.abort.get("action") == "rollback" and cfg.trainer.checkpoint_every < 1:
        return [
            "abort.action=rollback restores the last good checkpoint, but trainer.checkpoint_every=0 saves only at the end: pass trainer.checkpoint_every=<steps>, or abort.action=stop"
        ]
    return []


def _resolved_dims(cfg: DictConfig) -> ParallelDims | None:
    """The run's parallel degrees, or None when they do not fit the world (the parallel group's check says so)."""
    if not _is(cfg.parallel, ParallelConfig) or cfg.parallel.nproc < 1:
        return None
    world = launched_world_size(cfg.parallel.nproc)
    return None if ParallelDims.problems(cfg.parallel, "parallel", world) else ParallelDims.resolve(cfg.parallel, world)


def _check_batch_split(cfg: DictConfig) -> list[str]:
    """The dp ranks split each global batch evenly (degrees that do not fit the world are reported by the parallel check)."""
    if (dims := _resolved_dims(cfg)) is None:
        return []
    dp = dims.dp_size
    batch = cfg.trainer.batch_size
    if batch >= 1 and batch % dp:
        return [
            f"trainer.batch_size={batch} (the global batch) does not split evenly over {dp} data-parallel ranks: pass trainer.batch_size={max(dp, batch // dp * dp)}"
        ]
    return []


TP_UNTRIED = {"norm_position": "pre", "kv_lora_rank": 0, "attn_softcap": 0.0, "logit_softcap": 0.0, "scale_embeddings": False}
"""Model fields (and the value that is supported) the tensor-parallel plan is not written or tested for yet."""
CP_UNTRIED = {"kv_lora_rank": 0, "attn_softcap": 0.0}
"""The same for context parallelism's ring attention (it takes plain softmax attention over equal q/k/v widths)."""


def _untried_under(what: str, model: Any, untried: dict[str, Any]) -> list[str]:
    """One problem per model field in `untried` that is away from its supported value."""
    return [
        f"{what} with model.{key}={model[key]} is not supported yet: pass model.{key}={str(value).lower()} (or {what.split('=')[0]}=1)"
        for key, value in untried.items()
        if key in model and model[key] != value
    ]


def _check_tensor_parallel(cfg: DictConfig) -> list[str]:
    """parallel.tp splits attention heads (query and key/value alike), the MLP's hidden width and, sequence-parallel,
    the sequence between blocks: each must divide by tp. The plan is written for the GQA and MoE families (MoE layers
    are replicated over the tp ranks, so their widths need not divide)."""
    if not _is(cfg.parallel, ParallelConfig) or not cfg.parallel.tp > 1:
        return []
    tp, model = cfg.parallel.tp, cfg.model
    moe = _is(model, MoEConfig)
    if not (_is(model, GQAConfig) or moe):
        return [f"parallel.tp={tp} shards the GQA and MoE decoders (model=gqa|moe); {model._target_} has no tensor-parallel plan yet: pass parallel.tp=1"]
    problems = []
    for key in ("n_heads", "n_kv_heads") if moe else ("n_heads", "n_kv_heads", "mlp_hidden"):
        if model[key] % tp:
            fits = [d for d in divisors(model[key]) if d > 1]
            problems.append(
                f"parallel.tp={tp} does not divide model.{key}={model[key]}: choose parallel.tp in {fits or [1]}, or a model.{key} that {tp} divides"
            )
    if cfg.data.seq_len % tp:
        problems.append(
            f"parallel.tp={tp} does not divide data.seq_len={cfg.data.seq_len} (sequence parallel splits it): pass data.seq_len={cfg.data.seq_len // tp * tp}"
        )
    if model.get("qk_norm"):
        problems.append(f"parallel.tp={tp} with model.qk_norm=true is not supported yet (its norms would see a share of the heads): pass model.qk_norm=false")
    problems += _untried_under(f"parallel.tp={tp}", model, TP_UNTRIED)
    if moe and model.get("dense_layers") and (model.get("dense_hidden") or model.mlp_hidden) % tp:
        width = "dense_hidden" if model.get("dense_hidden") else "mlp_hidden"
        problems.append(
            f"parallel.tp={tp} does not divide model.{width}={model[width]}, the width of model.dense_layers' MLP: choose a model.{width} that {tp} divides"
        )
    if model.tie_embeddings:
        problems.append(
            f"parallel.tp={tp} with model.tie_embeddings=true is not supported (the tied weight would be sharded twice): pass model.tie_embeddings=false"
        )
    if moe and (dims := _resolved_dims(cfg)) is not None:
        dp = dims.dp_size
        if dp > 1:
            problems.append(
                f"parallel.tp={tp} with model=moe runs without data-parallel ranks for now ({dp} here: its replicated MoE layers are not "
                f"sharded or averaged over them yet): pass parallel=tp parallel.nproc={tp}"
            )
    return problems


def _check_expert_parallel(cfg: DictConfig) -> list[str]:
    """parallel.ep shares out each MoE layer's experts evenly; tokens travel to them dropless."""
    if not _is(cfg.parallel, ParallelConfig) or not cfg.parallel.ep > 1:
        return []
    ep, model = cfg.parallel.ep, cfg.model
    if not _is(model, MoEConfig):
        return [f"parallel.ep={ep} shards the experts of a mixture-of-experts model, and {model._target_} has none: pass model=moe, or parallel.ep=1"]
    problems = []
    if model.num_experts % ep:
        fits = [d for d in divisors(model.num_experts) if d > 1]
        problems.append(
            f"parallel.ep={ep} does not divide model.num_experts={model.num_experts}: choose parallel.ep in {fits or [1]}, or model.num_experts={ep * 2}"
        )
    if model.capacity_factor != 0:
        problems.append(
            f"parallel.ep={ep} runs dropless experts only for now, and model.capacity_factor={model.capacity_factor} drops: pass model.capacity_factor=0"
        )
    return problems


def _check_context_parallel(cfg: DictConfig) -> list[str]:
    """parallel.cp cuts each sequence into 2 * cp zig-zag chunks and rings causal attention over them (GQA)."""
    if not _is(cfg.parallel, ParallelConfig) or not cfg.parallel.cp > 1:
        return []
    cp, model, seq_len = cfg.parallel.cp, cfg.model, cfg.data.seq_len
    if not _is(model, GQAConfig):
        return [f"parallel.cp={cp} rings the attention of the GQA decoder (model=gqa); {model._target_} has no context-parallel plan yet: pass parallel.cp=1"]
    problems = []
    if seq_len % (2 * cp):
        problems.append(
            f"parallel.cp={cp} cuts data.seq_len={seq_len} into {2 * cp} equal chunks, which it does not divide: pass data.seq_len={max(2 * cp, seq_len // (2 * cp) * 2 * cp)}"
        )
    if model.sliding_window:
        problems.append(f"parallel.cp={cp} runs plain causal attention, not model.sliding_window={model.sliding_window}: pass model.sliding_window=0")
    if model.get("rope_scaling") in ("dynamic", "longrope"):
        problems.append(
            f"parallel.cp={cp} with model.rope_scaling={model.rope_scaling} is not supported (its tables follow the whole input's length, "
            f"which a rank does not see): pass parallel.cp=1"
        )
    return problems + _untried_under(f"parallel.cp={cp}", model, CP_UNTRIED)


def _check_pipeline_parallel(cfg: DictConfig) -> list[str]:
    """parallel.pp cuts the GQA decoder's layers into stages (pp per rank-loop of the schedule), each at least one layer,
    and its schedule runs trainer.grad_accum microbatches through them."""
    if not _is(cfg.parallel, ParallelConfig) or not cfg.parallel.pp > 1 or cfg.parallel.pp_schedule not in SCHEDULES:
        return []
    pp, schedule, model = cfg.parallel.pp, cfg.parallel.pp_schedule, cfg.model
    if not _is(model, GQAConfig):
        return [f"parallel.pp={pp} splits the GQA decoder (model=gqa) into stages; {model._target_} has no pipeline split yet: pass parallel.pp=1"]
    problems = []
    num_stages = pp * stages_per_rank(schedule)
    split, n_layers = cfg.parallel.pp_split, model.n_layers
    per_rank = f" ({stages_per_rank(schedule)} per rank under parallel.pp_schedule={schedule})" if num_stages > pp else ""
    if split is None and num_stages > n_layers:
        fits = [p for p in range(2, n_layers + 1) if p * stages_per_rank(schedule) <= n_layers]
        problems.append(
            f"parallel.pp={pp} makes {num_stages} stages{per_rank}, more than model.n_layers={n_layers}: "
            f"pass model.n_layers={num_stages} (or more), or parallel.pp in {fits or [1]}"
        )
    if split is not None and (len(split) != num_stages or sum(split) != n_layers or min(split) < 1):
        problems.append(
            f"parallel.pp_split={list(split)} must give each of the {num_stages} stages{per_rank} at least one layer and sum to model.n_layers={n_layers}: "
            f"pass parallel.pp_split={even_split(n_layers, num_stages) if n_layers >= num_stages else 'null'}, or parallel.pp_split=null (even by layer count)"
        )
    micro = microbatch_problem(schedule, cfg.trainer.grad_accum, pp)
    if micro:
        problems.append(f"parallel.pp_schedule={schedule} with trainer.grad_accum={cfg.trainer.grad_accum} (the microbatches of a step) {micro}")
    if model.tie_embeddings:
        problems.append(
            f"parallel.pp={pp} with model.tie_embeddings=true is not supported (the embedding and the readout live on different stages): pass model.tie_embeddings=false"
        )
    if cfg.trainer.precision == "fp16":
        problems.append(f"parallel.pp={pp} with trainer.precision=fp16 is not supported (the schedule runs the backward unscaled): pass trainer.precision=bf16")
    return problems


def _check_memory(cfg: DictConfig) -> list[str]:
    """Refuse a run that cannot fit, with the estimate (currytrain/estimate.py) and what to change: the layouts of
    the same ranks that fit (the advisor's per-rank prediction), model.ac=full, or smaller sizes."""
    from currytrain.estimate import GiB, count_split_parameters, device_memory, estimate_memory, on_gpu, predict

    available, where = device_memory(cfg.trainer.device)
    world, layout = launched_world_size(cfg.parallel.nproc), run_layout(cfg)
    try:
        estimate = estimate_memory(cfg, limit=available)
        # The per-layout prediction for several ranks, or to say what fits instead (it builds the model on meta again).
        split = layout is not None and not estimate.rough and (world > 1 or estimate.total > available)
        counts = count_split_parameters(cfg.model) if split else None
    except (OverflowError, RuntimeError, TypeError, ValueError, MemoryError) as error:  # sizes beyond what torch can even describe
        sizes = " / ".join(f"model.{key}={cfg.model[key]}" for key in ("dim", "n_layers", "vocab_size", "mlp_hidden", "max_seq_len") if key in cfg.model)
        return [f"the model cannot be built at this size ({sizes}: {str(error).splitlines()[0][:200]}): lower the sizes (or choose model/size)"]
    # On the CPU every rank of the run shares this machine's RAM; on GPUs each rank has its own device.
    sharing = 1 if on_gpu(cfg.trainer.device) else world
    per_rank = estimate.total if counts is None or world == 1 else predict(cfg, layout, *counts).peak + estimate.data
    if per_rank * sharing <= available:
        return []
    need = estimate.describe() if counts is None or world == 1 else f"{per_rank / GiB:,.1f} GiB per rank ({layout.name})"
    holds = f"{where} ({available / GiB:,.1f} GiB)" if sharing == 1 else f"{where} ({available / GiB:,.1f} GiB), which its {sharing} ranks share"
    fixes = _layouts_that_fit(cfg, world, available // sharing, counts) if counts is not None else []
    shrink = "lower model.dim / model.n_layers / model.mlp_hidden (or model/size), lower trainer.batch_size (raise trainer.grad_accum to keep the batch)" + (
        ", or lower data.num_tokens" if estimate.data else ""
    )
    return [f"the run needs about {need}, more than {holds}: " + "; ".join([*fixes, shrink if fixes else shrink + ", or set model.ac=full"])]


def run_layout(cfg: DictConfig):
    """The run's own parallel layout (currytrain.estimate.Layout), or None when its degrees do not resolve (their
    own check says why) or the config has no parallel group (a run folder's plain resolved.yaml has one)."""
    from currytrain.estimate import Layout

    parallel = cfg.parallel
    if "nproc" not in parallel or "zero_stage" not in parallel:
        return None
    world = launched_world_size(parallel.nproc)
    if ParallelDims.problems(parallel, "parallel", world):
        return None
    dims = ParallelDims.resolve(parallel, world)
    return Layout(dims.dp_size, parallel.zero_stage, tp=dims.tp, pp=dims.pp, cp=dims.cp, ep=dims.ep)


def _layouts_that_fit(cfg: DictConfig, world: int, budget: int, counts) -> list[str]:
    """The fixes `currytrain advise` would offer: layouts of `world` ranks that validation accepts and whose predicted
    peak per rank fits in `budget` bytes, with their overrides; else model.ac=full where that makes one fit."""
    from currytrain.estimate import GiB, candidate_layouts, predict

    offered = []
    for layout in candidate_layouts(cfg, world) if world > 1 else []:
        candidate = OmegaConf.merge(cfg, OmegaConf.from_dotlist(layout.overrides(world)))
        if not parallel_problems(candidate):
            offered.append((layout, predict(candidate, layout, *counts)))
    own = run_layout(cfg)
    offered.append((own, predict(cfg, own, *counts)))
    changed = lambda layout: [o for o in layout.overrides(world) if OmegaConf.select(cfg, o.split("=")[0]) != int(o.split("=")[1])]  # noqa: E731
    fits = [
        f"{layout.name} ({prediction.peak / GiB:,.2f} GiB per rank): pass {' '.join(changed(layout))}"
        for layout, prediction in offered
        if prediction.peak <= budget
    ]
    if fits:
        return ["layouts of these ranks that fit (currytrain advise): " + ", ".join(fits[:3])]
    with_ac = [(layout, prediction) for layout, prediction in offered if prediction.peak_ac <= budget]
    if with_ac:
        layout, prediction = with_ac[0]
        return [
            f"with activation checkpointing it fits ({layout.name}, {prediction.peak_ac / GiB:,.2f} GiB per rank): pass {' '.join(['model.ac=full', *changed(layout)])}"
        ]
    return []


def _check_fabric_precision(cfg: DictConfig) -> list[str]:
    """Fabric's fp16 scales the loss inside fabric.backward, which the step's clipping and finiteness check
    would read unscaled: curryTrain's own runtime has the GradScaler path."""
    if _is(cfg.parallel, ParallelConfig) and cfg.parallel.runtime == "fabric" and cfg.trainer.precision == "fp16":
        return [
            "trainer.precision=fp16 with parallel.runtime=fabric is not supported: pass trainer.precision=bf16, or parallel.runtime=torch (fp16 with a GradScaler)"
        ]
    return []


def _check_float8(cfg: DictConfig) -> list[str]:
    """trainer.precision=fp8 is built and tested on one process: torchao's float8 under FSDP's all-gathers, tensor
    parallelism's plans and the pipeline's stages needs their own wiring (torchtitan's float8 converters)."""
    if cfg.trainer.precision != "fp8" or not _is(cfg.parallel, ParallelConfig):
        return []
    world = launched_world_size(cfg.parallel.nproc) if cfg.parallel.nproc >= 1 else 1
    if world > 1 or cfg.parallel.runtime == "fabric":
        where = f"{world} processes" if world > 1 else "parallel.runtime=fabric"
        return [f"trainer.precision=fp8 runs on one process for now, and this run has {where}: pass parallel=single, or trainer.precision=bf16"]
    return []


def _check_loggers(cfg: DictConfig) -> list[str]:
    return [] if cfg.logger else ["logger is empty: pass logger=[tensorboard,jsonl] (or at least one logger)"]


def _check_eval(cfg: DictConfig) -> list[str]:
    """The evaluators read the run's text with its tokenizer, on a model whose whole forward runs on each rank."""
    node = cfg.get("eval")
    if node is None or not _is(node, EvalConfig):
        return []
    from currytrain.eval.source import codec_problem

    problems = []
    run = {key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("data", "trainer")}
    if problem := codec_problem(run, "eval", "pass data.tokenizer=<its tokenizer.json>, or eval=none"):
        problems.append(problem)
    dims = _resolved_dims(cfg) if _is(cfg.parallel, ParallelConfig) else None
    for axis in ("pp", "cp"):
        degree = getattr(dims, axis, 1) if dims is not None else 1
        if degree > 1:
            problems.append(
                f"eval (evaluators in the loop) with parallel.{axis}={degree}: a rank holds only part of the model's forward (its pipeline stages, its "
                f"share of each sequence), and the evaluators need all of it: pass eval=none and run `currytrain eval RUN` after training"
            )
    seq_len = node.seq_len if isinstance(node.seq_len, int) else 0
    if "max_seq_len" in cfg.model and seq_len > cfg.model.max_seq_len:
        problems.append(
            f"eval.seq_len={seq_len} exceeds model.max_seq_len={cfg.model.max_seq_len}: pass eval.seq_len={cfg.model.max_seq_len} or less (0: data.seq_len)"
        )
    return problems


PARALLEL_CHECKS = (_check_batch_split, _check_tensor_parallel, _check_expert_parallel, _check_context_parallel, _check_pipeline_parallel)
"""The rules that tie the parallel degrees to the model, the data and the trainer."""


def _check_documents(cfg: DictConfig) -> list[str]:
    """data.restart_positions / data.mask_documents need a RoPE decoder that sees whole windows: no context
    parallelism (a rank holds a slice of each window) and no pipeline (later stages do not see the tokens)."""
    data = cfg.data
    wanted = [key for key in ("restart_positions", "mask_documents") if data.get(key, False)]
    if not wanted:
        return []
    problems, flags = [], " and ".join(f"data.{key}=true" for key in wanted)
    if not _is(cfg.model, RopeDecoderConfig):
        problems.append(f"{flags} needs a RoPE decoder (model=gqa or model=moe), but model builds {cfg.model._target_}: pass {wanted[0]}=false")
    for axis in ("cp", "pp"):
        if cfg.parallel.get(axis, 1) > 1:
            problems.append(f"{flags} cannot go with parallel.{axis}={cfg.parallel[axis]} (a rank would not see whole windows): pass parallel.{axis}=1")
    return problems


CROSS_GROUP_CHECKS = (
    _check_model_and_data,
    _check_documents,
    _check_schedule,
    _check_init_from,
    _check_rollback,
    *PARALLEL_CHECKS,
    _check_fabric_precision,
    _check_float8,
    _check_loggers,
    _check_eval,
)


def parallel_problems(cfg: DictConfig) -> list[str]:
    """What validation refuses in the parallel layout of `cfg`: the parallel group's own checks (its degrees
    against the world size: ParallelDims.problems) and PARALLEL_CHECKS. currytrain advise offers only layouts
    for which this is empty."""
    return check_tree(cfg.parallel, "parallel") + [problem for check in PARALLEL_CHECKS for problem in check(cfg)]


def validate(cfg: DictConfig, run_dir: str | None = None) -> list[str]:
    """All problems of a composed config (empty when it is good)."""
    try:
        if mismatch := _check_tables(cfg):  # alone: the other checks read fields (data.seq_len) one side lacks
            return mismatch
        allow = cfg.build.allow if isinstance(cfg.build.allow, ListConfig) else []  # not a list: check_tree says so
        problems = [problem for key in cfg.keys() if key != "hydra" for problem in target_problems(cfg._get_node(key), str(key), extra=allow)]
        problems += check_tree(cfg)
        problems += [problem for key in cfg.keys() if key != "hydra" for problem in argument_problems(cfg._get_node(key), str(key), allow)]
        for check in CROSS_GROUP_CHECKS:
            problems += _reading_files(check, cfg)
        problems += _reading_files(_check_run_dir, cfg, run_dir)
        # Sizing builds the model on the meta device: only once every value it reads is known good.
        return problems or _check_memory(cfg)
    except OmegaConfBaseException as error:  # an interpolation that cannot resolve, a missing value
        return unreadable_values(cfg) or [f"{getattr(error, 'full_key', None) or 'the config'} cannot be read: {str(error).splitlines()[0]}"]


def _reading_files(check: Any, *args: Any) -> list[str]:
    """A check's problems; a ConfigError raised while it read a file the config names (a marker, a model.yaml of the
    wrong shape) is one more problem, reported with the others."""
    try:
        return check(*args)
    except ConfigError as error:
        return [str(error)]


def unreadable_values(node: Any, path: str = "") -> list[str]:
    """Every value of the tree (hydra's aside) that cannot be read, with its key: an interpolation naming a key that
    does not exist, a mandatory value left missing (???)."""
    problems = []
    keys = range(len(node)) if isinstance(node, ListConfig) else [key for key in node.keys() if path or key != "hydra"]
    for key in keys:
        where = f"{path}[{key}]" if isinstance(node, ListConfig) else f"{path}.{key}" if path else str(key)
        try:
            child = node._get_node(key)
            if isinstance(child, DictConfig | ListConfig) and not child._is_interpolation():
                problems += unreadable_values(child, where)
            else:
                node[key]
        except MissingMandatoryValue:
            problems.append(f"{where} has no value (???): pass {where}=<value>")
        except OmegaConfBaseException as error:
            value = node._get_node(key)._value() if node._get_node(key) is not None else None
            problems.append(f"{where}={value} cannot be read ({str(error).splitlines()[0]}): fix the value or the interpolation of {where}")
    return problems


TYPED_GROUPS = ("model", "data", "parallel", "optimizer", "check", "sweep", "abort", "cost")
"""Root keys whose node a stored schema types (schema/<group>/<option> in Hydra's ConfigStore); logger's entries too."""


def typed_node(group: str, node: Any, where: str) -> tuple[Any, list[str]]:
    """`node` (plain data) typed by the schema of `group` whose _target_ it names, as composition types it: its keys
    and values checked by that schema. (node, []) when it fits one, else (untyped node, the problem)."""
    from hydra.core.config_store import ConfigStore

    if not isinstance(node, dict):
        return node, [f"{where}={node} is not a config node (a mapping): restore the file"]
    schemas = [entry.node for entry in ConfigStore.instance().repo.get("schema", {}).get(group, {}).values()]
    candidates = [schema for schema in schemas if schema.get("_target_") == node.get("_target_")]
    reasons = []
    for schema in candidates:
        try:
            return OmegaConf.merge(schema, node), []
        except OmegaConfBaseException as error:
            reasons.append(str(error).splitlines()[0])
    if not candidates:
        return OmegaConf.create(node), []  # an unregistered _target_: target_problems refuses it by name
    return OmegaConf.create(node), [f"{where} does not fit its schema ({reasons[0]}): restore the file"]


def typed_run_config(data: dict[str, Any]) -> tuple[DictConfig, list[str]]:
    """A run folder's resolved config (plain data, weights.read_yaml_mapping) typed as a launch's composed config is,
    so that validate() checks its keys and ranges too; the problems found while typing it."""
    from hydra.core.config_store import ConfigStore

    root = ConfigStore.instance().repo["root_schema.yaml"].node
    plain = {key: value for key, value in data.items() if key not in (*TYPED_GROUPS, "logger")}
    problems: list[str] = []
    try:
        cfg = OmegaConf.merge(root, plain)
    except OmegaConfBaseException as error:
        return OmegaConf.create(data), [f"the config does not fit curryTrain's root schema ({str(error).splitlines()[0]}): restore the file"]
    for group in TYPED_GROUPS:
        if group in data:
            cfg[group], found = typed_node(group, data[group], group)
            problems += found
    loggers = data.get("logger") or {}
    if not isinstance(loggers, dict):
        return cfg, problems + [f"logger={loggers} is not a mapping of logger nodes: restore the file"]
    for name, node in loggers.items():
        cfg.logger[name], found = typed_node("logger", node, f"logger.{name}")
        problems += found
    return cfg, problems


def raise_on_problems(problems: list[str]) -> None:
    if problems:
        raise ConfigError(format_problems(problems))


_validated: set[str] = set()
"""The run folders ValidateCallback validated in this process (run.run validates any other itself)."""


def validated(run_dir: str | Path) -> bool:
    return str(Path(run_dir).resolve()) in _validated


def validate_or_stop(config: DictConfig, run_dir: str | None = None) -> list[str]:
    """validate(), where nothing may slip through as a warning: Hydra turns a callback's exception into one and runs
    the job. A problem is returned; any other exception stops the command (ValidationCrashed: exit 1 with the
    traceback, a bug of curryTrain's validation, since every reader of a user's file reports problems instead)."""
    try:
        return validate(config, run_dir)
    except ConfigError as error:
        return [str(error)]
    except Exception as error:
        raise ValidationCrashed(error) from error


class ValidateCallback(Callback):
    """Hydra callback: reject a bad config before Hydra creates the run folder (ConfigRejected escapes
    Hydra's handling of callback errors, which would only warn), then hold the run folder (currytrain.lock)
    before Hydra writes into it; run.run releases it when the run ends."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        take_vocab_from_tokenizer(config)  # the task receives this config: the size it takes is the one it runs
        run_dir = OmegaConf.select(config, "hydra.run.dir")
        held = held_by_another(run_dir) if run_dir else None  # first: a folder in use explains the other problems
        problems = validate_or_stop(config, run_dir)
        if problems and run_dir and not held:  # a run that took the folder while this one validated wrote into it
            held = held_by_another(run_dir)
        self._reject(([held] if held else []) + problems)
        if run_dir:
            _validated.add(str(Path(run_dir).resolve()))
        if run_dir:
            try:
                acquire(run_dir)
            except ConfigError as error:  # another process took it since the look above
                raise ConfigRejected(error) from None
            except OSError as error:  # the folder became unwritable since the look above
                raise ConfigRejected(ConfigError(f"hydra.run.dir={run_dir} cannot be written ({error.strerror}): choose another run folder")) from None

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        """The run's job ended without releasing the folder (Hydra failed before the task ran)."""
        run_dir = OmegaConf.select(config, "hydra.run.dir")
        if run_dir and (lock := holding(run_dir)) is not None:
            lock.release()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._reject(validate_or_stop(config))

    @staticmethod
    def _reject(problems: list[str]) -> None:
        if problems:
            raise ConfigRejected(ConfigError(format_problems(problems)))
