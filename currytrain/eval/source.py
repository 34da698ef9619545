"""What `currytrain generate` and `currytrain eval` read: the model of a run folder (its latest complete
checkpoint), of one checkpoint folder or of an import folder, with the tokenizer its data used.

The tokenizer, first match wins: the one passed (--tokenizer), an import folder's hf/tokenizer.json, the run's
data.tokenizer (and its data.eos_token), bytes for a run on a byte corpus (data=bytes, data=text), the hf/ of
the import the run started from (trainer.init_from).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from currytrain.data.config import StdlibBytesConfig, TextConfig
from currytrain.data.tokenizer import find_tokenizer
from currytrain.errors import ConfigError
from currytrain.eval.text import Codec, byte_codec, find_folder_tokenizer, tokenizer_codec
from currytrain.weights import MODEL_YAML, RESOLVED, find_checkpoint, is_complete, model_node_of, read_yaml_mapping

log = logging.getLogger(__name__)

BYTE_CORPORA = (StdlibBytesConfig._target_, TextConfig._target_)
"""The data classes whose tokens are the bytes of UTF-8 text (vocab 256)."""


@dataclass
class Source:
    """A model ready to generate from or to evaluate, and how its text is read."""

    model: Any
    """The nn.Module, weights loaded, in eval mode."""
    codec: Codec
    context: int | None
    """Tokens the model attends over at most (model.max_seq_len; None when its config has no such field)."""
    node: dict[str, Any]
    """Its model config node."""
    weights: Path
    """The checkpoint or import folder the weights came from."""
    step: int | None
    """The training step of the checkpoint (None for an import)."""


def run_config(path: Path) -> dict[str, Any] | None:
    """The resolved config of a run folder or of one of its checkpoint folders, or None (an import folder). Read
    as an untrusted file (read_yaml_mapping: bounded work, no aliases or interpolations)."""
    for folder in (path, path.parent.parent):
        if (folder / RESOLVED).is_file():
            return read_yaml_mapping(folder / RESOLVED)
    return None


def weights_folder(path: Path) -> tuple[Path, int | None]:
    """(the folder the weights are read from, its step): the import folder, the checkpoint folder, or the latest
    complete checkpoint of a run folder."""
    from currytrain.weights import checkpoint_step

    if (path / MODEL_YAML).is_file():
        return path, None
    checkpoint = path if is_complete(path) else find_checkpoint(path)
    if checkpoint is None:
        raise ConfigError(
            f"{path} has no complete checkpoint (checkpoints/step_N with a COMPLETE marker) and is no import folder ({MODEL_YAML} + model.safetensors): "
            "pass a run folder that finished or saved one (trainer.checkpoint_every=N), a checkpoint folder or a `currytrain hf import` folder"
        )
    return checkpoint, checkpoint_step(checkpoint)


def find_codec(path: Path, config: dict[str, Any] | None, tokenizer: str | None) -> Codec:
    """How the text of the model at `path` is read (the module docstring's order)."""
    if tokenizer:
        found, problem = find_tokenizer(tokenizer)
        if problem:
            raise ConfigError(problem.replace("data.tokenizer", "--tokenizer"))
        return tokenizer_codec(found)
    if (path / MODEL_YAML).is_file():
        found = find_folder_tokenizer(path / "hf")
        if found is None:
            raise ConfigError(f"{path} is an import folder without hf/tokenizer.json: pass --tokenizer <tokenizer.json or a folder holding one>")
        return tokenizer_codec(found)
    return run_codec(config or {}, f"the run at {path}", "pass --tokenizer <tokenizer.json>")


def run_codec(config: dict[str, Any], what: str = "the run", fix: str = "pass eval=none") -> Codec:
    """How a run's data reads text (its resolved config): data.tokenizer, bytes for a byte corpus, or the hf/
    tokenizer of the import it started from; a ConfigError (naming `what` and the `fix`) for data that is not text."""
    problem = codec_problem(config, what, fix)
    if problem:
        raise ConfigError(problem)
    data = section(config, "data")
    if data.get("tokenizer"):
        return tokenizer_codec(find_tokenizer(str(data["tokenizer"]))[0], str(data.get("eos_token", "auto")))
    if data.get("_target_") in BYTE_CORPORA:
        return byte_codec()
    return tokenizer_codec(find_folder_tokenizer(_init_from(config) / "hf"))


def codec_problem(config: dict[str, Any], what: str = "the run", fix: str = "pass eval=none") -> str | None:
    """Why a run's text cannot be read (the data is no text and names no tokenizer), or None. Torch-free."""
    data = section(config, "data")
    if data.get("tokenizer"):
        _, problem = find_tokenizer(str(data["tokenizer"]))
        return f"{what} reads its text with {problem}" if problem else None
    if data.get("_target_") in BYTE_CORPORA or find_folder_tokenizer(_init_from(config) / "hf") is not None:
        return None
    return f"{what} trains on data._target_={data.get('_target_')}, which is not text (no data.tokenizer, not a byte corpus): {fix}"


def section(config: dict[str, Any] | None, key: str) -> dict[str, Any]:
    """config[key] when it is a mapping, else {} (a run folder's resolved.yaml is read as untrusted data)."""
    value = (config or {}).get(key)
    return value if isinstance(value, dict) else {}


def _init_from(config: dict[str, Any]) -> Path:
    return Path(str(section(config, "trainer").get("init_from", "none"))).expanduser()


def load_source(location: str | Path, tokenizer: str | None = None, device: str = "cpu") -> Source:
    """The model at `location` (run, checkpoint or import folder) on `device`, with its Codec. Bad input (no
    such folder, no complete checkpoint, no tokenizer, a tokenizer larger than the model's vocabulary) is a
    ConfigError naming the path and the fix."""
    import torch

    from currytrain.hf.convert import load_model

    path = Path(location).expanduser()
    if not path.exists():
        raise ConfigError(f"{location} does not exist: pass a run folder, a checkpoint folder or a `currytrain hf import` folder")
    weights, step = weights_folder(path)
    codec = find_codec(path, run_config(path), tokenizer)
    model = load_model(weights).to(torch.device(device))
    node = model_node_of(weights) or {}
    vocab = node.get("vocab_size")
    if vocab is not None and codec.vocab_size > int(vocab):
        raise ConfigError(f"{codec.name} has {codec.vocab_size} tokens and the model {vocab}: pass the --tokenizer the model was trained with")
    context = node.get("max_seq_len")
    log.info("loaded %s (%s) with %s", weights, node.get("_target_", "?"), codec.name)
    return Source(model, codec, int(context) if context else None, node, weights, step)
