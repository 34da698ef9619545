"""Import (Hugging Face folder -> curryTrain folder) and export (curryTrain run or import folder -> HF folder).

An import folder:

    model.yaml          the model group node (_target_ + fields), buildable with currytrain.build.build
    model.safetensors   the weights under curryTrain parameter names, in the source's dtype
    hf/                 the source's config.json, generation_config.json and tokenizer files, verbatim
    import.json         provenance: source, architecture, parameter count
    experiment/finetune.yaml   a launch.py experiment that fine-tunes the import on text with its tokenizer

Weights move through safetensors only; nothing is unpickled. Folders are written under a temporary
name and renamed into place, so an interrupted command leaves no half-written output.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from currytrain.errors import ConfigError
from currytrain.hf.families import FAMILIES, closest_family
from currytrain.hf.families.base import Family
from currytrain.hf.finetune import write_finetune_experiment
from currytrain.hf.hub import resolve_source
from currytrain.weights import MODEL_YAML, RESOLVED, architecture_mismatch, find_checkpoint, model_node_of, read_yaml_mapping, safetensors_problem

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
HF_DIR = "hf"
PROVENANCE = "import.json"
INDEX = "model.safetensors.index.json"
# Files an export copies from an import folder's hf/ (the tokenizer and generation settings).
PASSTHROUGH = ("generation_config.json", "tokenizer*", "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template*")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _require(module: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise ConfigError(f"the HF bridge needs {module}: pip install 'currytrain[hf]'") from None


# ---------------------------------------------------------------------------------------------- import


class SafetensorsReader:
    """The tensors of a HF folder, one file or sharded by model.safetensors.index.json, read on demand.

    A read returns a view into its file's mapping (no copy): callers copy what they keep (Family.to_currytrain
    does), so no shard outlives its reads. One file is open at a time: reading another closes the previous one,
    so an import holds at most one shard beside the tensors it has copied (tests/test_hf.py measures it).
    """

    def __init__(self, folder: Path):
        safetensors = _require("safetensors")
        index = folder / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError):
                raise ConfigError(f"{index} is not a safetensors index (JSON with a weight_map): download the checkpoint again") from None
            files = {name: folder / shard for name, shard in weight_map.items()}
        elif (folder / WEIGHTS).is_file():
            _check_safetensors(folder / WEIGHTS)
            with _unreadable(folder / WEIGHTS), safetensors.safe_open(folder / WEIGHTS, framework="pt") as handle:
                files = {name: folder / WEIGHTS for name in handle.keys()}
        else:
            pickled = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt*"))
            hint = f" (found only {pickled[:3]}; curryTrain never unpickles weights: convert them to safetensors first)" if pickled else ""
            raise ConfigError(f"{folder} has neither {WEIGHTS} nor {INDEX}{hint}")
        self.files = files
        self._path: Path | None = None
        self._handle: Any = None
        self._safe_open = safetensors.safe_open

    def keys(self) -> set[str]:
        return set(self.files)

    def __call__(self, name: str) -> torch.Tensor:
        path = self.files[name]
        if path != self._path:
            self.close()  # first: the previous shard's mapping is released before the next one is made
            if not path.is_file():
                raise ConfigError(f"{path} is listed in {INDEX} but missing: download the checkpoint again")
            _check_safetensors(path)
            with _unreadable(path):
                self._handle, self._path = self._safe_open(path, framework="pt"), path
        with _unreadable(path):
            return self._handle.get_tensor(name)

    def close(self) -> None:
        """Release the open file (its mapping lives on only in views a caller still holds)."""
        self._handle = self._path = None


def _check_safetensors(path: Path) -> None:
    """A ConfigError naming `path` when it is not a complete safetensors file (read before any tensor is)."""
    if problem := safetensors_problem(path):
        raise ConfigError(problem)


@contextlib.contextmanager
def _unreadable(path: Path) -> Iterator[None]:
    """safetensors' own error (a header that parses but describes impossible tensors) as a ConfigError naming the file."""
    try:
        yield
    except Exception as error:
        if type(error).__name__ != "SafetensorError":
            raise
        raise ConfigError(f"{path} is not a readable safetensors file ({error}); download or write it again") from None


def _family_of(hf_config: Any) -> Family:
    architectures = list(getattr(hf_config, "architectures", None) or [])
    for name in architectures:
        if name in FAMILIES:
            return FAMILIES[name]
    if not architectures:  # older or hand-written configs: the model type alone decides
        for family in FAMILIES.values():
            if family.model_type == getattr(hf_config, "model_type", None):
                return family
    found = architectures or [f"model_type={getattr(hf_config, 'model_type', '?')}"]
    raise ConfigError(f"unsupported architecture {found}: curryTrain imports {list(FAMILIES)}")


def _check_against_model(node: dict[str, Any], state: dict[str, torch.Tensor], what: str) -> None:
    """Build the curryTrain model on the meta device and compare names and shapes with `state`."""
    from currytrain.model import build_shapes

    model = build_shapes(OmegaConf.create(node))
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if node.get("tie_embeddings"):
        expected.pop("output.weight", None)
    got = {name: tuple(t.shape) for name, t in state.items()}
    problems = [f"missing {n}" for n in sorted(set(expected) - set(got))]
    problems += [f"unexpected {n}" for n in sorted(set(got) - set(expected))]
    problems += [f"{n}: shape {got[n]} != {expected[n]}" for n in sorted(set(got) & set(expected)) if got[n] != expected[n]]
    if problems:
        raise ConfigError(f"{what} does not fit {node['_target_']}: " + "; ".join(problems[:8]))


def default_import_folder(source: str) -> Path:
    """runs/hf/<last path component of the folder or Hub id>, inside the git-ignored runs/."""
    return Path("runs") / "hf" / Path(source.rstrip("/")).expanduser().name


def import_hf(source: str, out: str | Path | None = None, revision: str | None = None, overwrite: bool = False) -> Path:
    """Convert a HF checkpoint (local folder or Hub id) into an import folder; returns its path."""
    out = Path(out) if out is not None else default_import_folder(source)
    _check_output(
        out, overwrite, "--out", source=Path(source).expanduser() if Path(source).expanduser().exists() else None, mark=PROVENANCE
    )  # before any download
    transformers = _require("transformers")
    folder = resolve_source(source, revision)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder} has no config.json: pass the folder of a Hugging Face checkpoint")
    refuse_links(folder, ("config.json", "*.safetensors", INDEX) + PASSTHROUGH, within=hub_repo_folder(folder))
    try:
        # Never the folder's own Python (auto_map): transformers would ask to run it, or run it when told to trust it.
        hf_config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except (ValueError, KeyError, OSError) as error:
        raise ConfigError(f"{folder}/config.json cannot be read by transformers {transformers.__version__}: {error}") from None
    family = _family_of(hf_config)
    problems = family.problems(hf_config)
    if problems:
        raise ConfigError(f"{source} ({family.architecture}) cannot be imported exactly: " + "; ".join(problems))
    node = family.model_node(hf_config)

    reader = SafetensorsReader(folder)
    available = reader.keys()
    state, used, missing = family.to_currytrain(reader, available, node)
    reader.close()
    ignored = {n for n in available - used if family.ignored(n, node)}
    unexpected = sorted(available - used - ignored)
    if missing or unexpected:
        parts = ([f"missing {missing[:5]}"] if missing else []) + ([f"unexpected {unexpected[:5]}"] if unexpected else [])
        raise ConfigError(f"{source}: the weights do not match its {family.architecture} config: " + "; ".join(parts))
    _check_against_model(node, state, f"the weights of {source}")

    num_params = sum(t.numel() for t in state.values())
    with _staging(out) as stage:
        header = f"# curryTrain model imported from {source} ({family.architecture}); weights in {WEIGHTS}\n"
        (stage / MODEL_YAML).write_text(header + OmegaConf.to_yaml(OmegaConf.create(node)))
        _save(state, stage / WEIGHTS, {"source": source, "architecture": family.architecture})
        (stage / HF_DIR).mkdir()
        for pattern in ("config.json",) + PASSTHROUGH:
            for path in folder.glob(pattern):
                shutil.copy2(path, stage / HF_DIR / path.name)
        provenance = {"source": source, "folder": str(folder.resolve()), "architecture": family.architecture, "num_params": num_params}
        (stage / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        write_finetune_experiment(stage, node, out, source)
    log.info("imported %s (%s, %.2fM parameters) -> %s", source, family.architecture, num_params / 1e6, out)
    return out


# ---------------------------------------------------------------------------------------------- export


def read_model(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], Path | None]:
    """(model node, state in curryTrain names, the import's hf/ folder or None) of an import folder, a run
    folder (its latest complete checkpoint) or one checkpoint folder <run>/checkpoints/step_N."""
    path = Path(path).expanduser()
    if (path / MODEL_YAML).is_file() and (path / WEIGHTS).is_file():
        node = model_node_of(path)
        safetensors_torch = _require("safetensors.torch")
        _check_safetensors(path / WEIGHTS)
        with _unreadable(path / WEIGHTS):
            state = safetensors_torch.load_file(path / WEIGHTS)
        if node.get("tie_embeddings"):
            state.pop("output.weight", None)
        hf_dir = path / HF_DIR
        return node, state, hf_dir if hf_dir.is_dir() else None
    node = model_node_of(path)
    if node is None:
        raise ConfigError(
            f"{path} is neither a run folder ({RESOLVED} + checkpoints/step_N), a checkpoint folder nor an import folder "
            f"({MODEL_YAML} + {WEIGHTS}): pass one of those"
        )
    checkpoint = find_checkpoint(path)
    if checkpoint is None:
        raise ConfigError(f"{path} has no complete checkpoint under checkpoints/: let the run finish (it saves at the end) or pass trainer.checkpoint_every=N")
    return node, _load_checkpoint(node, checkpoint), _run_hf_dir(path)


def _run_hf_dir(path: Path) -> Path | None:
    """The HF files a run carries on: the hf/ of the import it started from (trainer.init_from), else the
    folder of its data.tokenizer (tokenizer files only). None for runs on curryTrain's byte corpora."""
    resolved = next((p / RESOLVED for p in (path, path.parent.parent) if (p / RESOLVED).is_file()), None)
    if resolved is None:
        return None
    cfg = read_yaml_mapping(resolved)
    trainer, data = (cfg.get(key) if isinstance(cfg.get(key), dict) else {} for key in ("trainer", "data"))
    init_from = Path(str(trainer.get("init_from", "none"))).expanduser()
    if (init_from / HF_DIR / "config.json").is_file():
        return init_from / HF_DIR
    tokenizer = data.get("tokenizer")
    if isinstance(tokenizer, str) and tokenizer:
        from currytrain.data.tokenizer import find_tokenizer

        found, _ = find_tokenizer(str(tokenizer))
        return found.parent if found is not None else None
    return None


def _load_checkpoint(node: dict[str, Any], checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model weights of a DCP training checkpoint ({"train": {"model": ...}}), without its optimizer state."""
    from currytrain.checkpoint import load_model_state
    from currytrain.model import build_model

    state = build_model(OmegaConf.create(node)).state_dict()
    load_model_state(checkpoint, state)
    if node.get("tie_embeddings"):
        state.pop("output.weight", None)
    log.info("read %s", checkpoint)
    return dict(state)


def load_weights(model: torch.nn.Module, path: str | Path, model_cfg: Any | None = None, what: str | None = None) -> dict[str, Any]:
    """Load the weights of an import folder, run folder or checkpoint folder into `model` (strict); returns
    their model node. With model_cfg, a model the weights were not written for is a ConfigError naming the fix."""
    node, state, _ = read_model(path)
    if model_cfg is not None and (problem := architecture_mismatch(node, model_cfg)):
        raise ConfigError(f"{what or path} {problem}")
    _load_state(model, node, state)
    return node


def _load_state(model: torch.nn.Module, node: dict[str, Any], state: dict[str, torch.Tensor]) -> None:
    if node.get("tie_embeddings"):  # stored once; the readout shares the embedding's tensor
        state = {**state, "output.weight": state["tok_embeddings.weight"]}
    model.load_state_dict(state, strict=True)


def load_model(path: str | Path) -> torch.nn.Module:
    """The curryTrain model of an import folder, run folder or checkpoint folder, weights loaded, in eval mode."""
    from currytrain.model import build_model

    node, state, _ = read_model(path)
    model = build_model(OmegaConf.create(node))
    _load_state(model, node, state)
    return model.eval()


def export_hf(source: str | Path, out: str | Path, dtype: str | None = None, overwrite: bool = False, max_shard_size: int | str = "5GB") -> Path:
    """Write config.json + model.safetensors (+ generation/tokenizer files of an import) that transformers loads;
    weights above max_shard_size go to model-0000N-of-0000M.safetensors shards with an index."""
    out = Path(out)
    _check_output(out, overwrite, "OUTDIR", source=Path(source).expanduser())
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype} is not one of {list(DTYPES)}")
    node, state, hf_dir = read_model(source)
    write_hf(node, state, out, dtype=dtype, hf_dir=hf_dir, what=str(source), max_shard_size=max_shard_size)
    return out


def write_hf(
    node: dict[str, Any],
    state: dict[str, torch.Tensor],
    out: Path,
    dtype: str | None = None,
    hf_dir: Path | None = None,
    what: str = "the model",
    max_shard_size: int | str = "5GB",
) -> None:
    """The HF folder of a model node and its state (curryTrain names); hf_dir: an import's original files."""
    transformers = _require("transformers")
    if hf_dir is not None:
        refuse_links(hf_dir, ("config.json",) + PASSTHROUGH)
    has_config = hf_dir is not None and (hf_dir / "config.json").is_file()
    try:
        original = json.loads((hf_dir / "config.json").read_text()) if has_config else {}
    except ValueError:
        original = None
    if not isinstance(original, dict):
        raise ConfigError(f"{hf_dir / 'config.json'} is not a JSON mapping (the import folder was changed): import the checkpoint again")
    family, problems = closest_family(node, prefer=(original.get("architectures") or [None])[0])
    if family is None and (builtin := computed_as_builtin(node, state)) is not None:
        log.info("%s: %s computes what %s computes on these weights: exported as that family", what, node["_target_"], builtin["_target_"])
        node = builtin
        family, problems = closest_family(node, prefer=(original.get("architectures") or [None])[0])
    if family is None:
        raise ConfigError(f"{what}: {problems[0]}")
    if node.get("mup"):
        problems.append("model.mup=true: its logit multiplier and attention scale have no Hugging Face equivalent (train with model.mup=false to export)")
    dropped = sorted(set(state) - family.exported_names(node))
    if dropped:  # a weight transformers would never see: its logits would differ from ours
        problems.append(f"{len(dropped)} weights have no {family.architecture} counterpart and would be dropped: {dropped[:4]}")
    if problems:
        raise ConfigError(f"{what} cannot be exported as {family.architecture}: " + "; ".join(problems))

    tensors = family.to_hf(state, node)
    target = DTYPES[dtype] if dtype else next(iter(tensors.values())).dtype
    tensors = {name: t.detach().to(target).contiguous() for name, t in tensors.items()}
    kwargs = family.hf_kwargs(node)
    if has_config:  # an import: keep the tokenizer's special ids
        kwargs.update({key: original[key] for key in TOKEN_IDS if key in original})
        # A fine-tune at a shorter model.max_seq_len (it only sizes the RoPE tables) keeps the checkpoint's context.
        kwargs["max_position_embeddings"] = max(kwargs["max_position_embeddings"], original.get("max_position_embeddings", 0))
    else:  # a run on curryTrain's own data: no tokenizer, so no special tokens to claim
        kwargs.update(dict.fromkeys(TOKEN_IDS))
    config = getattr(transformers, family.config_class)(**kwargs)
    config.architectures = [family.architecture]
    setattr(config, "dtype" if hasattr(config, "dtype") else "torch_dtype", str(target).removeprefix("torch."))

    with _staging(out) as stage:
        config.save_pretrained(stage)
        _save_sharded(tensors, stage, max_shard_size)
        (stage / EXPORT_MARK).write_text(json.dumps({"source": what}) + "\n")
        if hf_dir is not None:
            for pattern in PASSTHROUGH:
                for path in hf_dir.glob(pattern):
                    shutil.copy2(path, stage / path.name)
    log.info("exported %s as %s (%s) -> %s", what, family.architecture, target, out)


# ---------------------------------------------------------------------------------------------- files


BUILTIN_FAMILIES = ("currytrain.model.gqa.GQATransformer", "currytrain.model.moe.MoETransformer")
"""The classes export has Hugging Face counterparts for."""


def computed_as_builtin(node: dict[str, Any], state: dict[str, torch.Tensor]) -> dict[str, Any] | None:
    """A project's own copy of a built-in family (`currytrain scaffold NAME --from gqa`): its node with the built-in
    class as `_target_` when that class builds from the same fields, loads these weights and computes the same logits
    on them (so a copy whose forward was edited is not exported as the family); else None."""
    from hydra.errors import InstantiationException

    from currytrain.model import build_model

    if str(node.get("_target_", "")) in BUILTIN_FAMILIES or "vocab_size" not in node:
        return None
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(int(node["vocab_size"]), (2, min(16, int(node.get("max_seq_len", 16)))), generator=generator)
    try:
        own = build_model(OmegaConf.create(node)).eval()
        _load_state(own, node, dict(state))
        with torch.no_grad():
            expected = own(tokens)
    except Exception as error:  # the project's class: whatever it raises, it is not a family's copy to export
        log.info("%s: not comparable with a built-in family (%s)", node.get("_target_"), error)
        return None
    for target in BUILTIN_FAMILIES:
        candidate = {**node, "_target_": target}
        try:
            builtin = build_model(OmegaConf.create(candidate)).eval()
            _load_state(builtin, candidate, dict(state))
            with torch.no_grad():
                same = torch.allclose(builtin(tokens), expected, rtol=1e-4, atol=1e-5)
        except (InstantiationException, TypeError, RuntimeError, ValueError, ConfigError):  # another field set (Hydra wraps the TypeError), or other weights
            continue
        if same:
            return candidate
    return None


def hub_repo_folder(folder: Path) -> Path | None:
    """The repo folder of the HF cache (models--org--name) when `folder` is one of its snapshots, whose files link
    into the repo's blobs/; None for any other folder."""
    repo = folder.resolve().parent.parent
    return repo if folder.resolve().parent.name == "snapshots" and repo.name.startswith("models--") else None


def refuse_links(folder: Path, patterns: tuple[str, ...], within: Path | None = None) -> None:
    """A ConfigError for any file of `folder` matching `patterns` that is a symbolic link (pointing anywhere, it
    would be read or copied as the folder's own: a tokenizer.json linked to a private key), unless it resolves
    inside `within` (the HF cache's own links from a snapshot to its blobs)."""
    for pattern in patterns:
        for path in sorted(folder.glob(pattern)):
            if path.is_symlink() and not (within is not None and path.resolve().is_relative_to(within)):
                raise ConfigError(
                    f"{path} is a symbolic link (to {os.readlink(path)}): curryTrain reads and copies only a folder's own files; "
                    "replace the link with the file itself (cp -L), or pass the folder the link points into"
                )


EXPORT_MARK = ".currytrain-export"
"""Written into every folder `hf export` makes: --overwrite replaces only a folder holding it (or an import folder's
import.json, for `hf import --overwrite`), never a folder curryTrain did not write."""
RUN_FOLDER_SIGNS = ("journal.jsonl", RESOLVED, "checkpoints", "optuna.db")


def run_folder_inside(folder: Path) -> Path | None:
    """The first run folder (or sweep folder) at or below `folder`, by what one holds; None if there is none."""
    for root, dirs, files in os.walk(folder):
        if any(sign in files or sign in dirs for sign in RUN_FOLDER_SIGNS):
            return Path(root)
        dirs[:] = [name for name in dirs if not name.startswith(".")]
    return None


def _check_output(out: Path, overwrite: bool, flag: str, source: Path | None = None, mark: str = EXPORT_MARK) -> None:
    """Refuse an output folder that would lose data: a file, a folder that is not empty (without --overwrite), and
    with --overwrite any folder that holds a run or sweep folder, holds the source itself, or was not written by
    this command (no `mark`)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{flag} {out} is a file: pass a folder path")
    if not (out.is_dir() and any(out.iterdir())):
        return
    if not overwrite:
        raise ConfigError(f"{flag} {out} already exists and is not empty: choose another folder or pass --overwrite")
    resolved = out.resolve()
    if source is not None and (source.resolve() == resolved or source.resolve().is_relative_to(resolved)):
        raise ConfigError(f"{flag} {out} holds the source {source}: --overwrite would delete it. Choose an output folder outside it")
    if (run := run_folder_inside(out)) is not None:
        raise ConfigError(f"{flag} {out} holds a run folder ({run}): --overwrite never replaces one. Choose another output folder")
    if not (out / mark).is_file():
        raise ConfigError(
            f"{flag} {out} was not written by curryTrain (it has no {mark}): --overwrite replaces only a folder this command made. "
            "Choose another folder, or remove it yourself"
        )


def _save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    safetensors_torch = _require("safetensors.torch")
    # safetensors refuses tensors that share storage (tied weights, views): give each its own.
    owned: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in tensors.items():
        pointer = tensor.untyped_storage().data_ptr()
        owned[name] = tensor.clone() if pointer in seen or not tensor.is_contiguous() else tensor
        seen.add(pointer)
    safetensors_torch.save_file(owned, path, metadata=metadata)


def _save_sharded(tensors: dict[str, torch.Tensor], folder: Path, max_shard_size: int | str) -> None:
    """model.safetensors, or shards of at most max_shard_size (bytes, or "5GB") plus the index transformers reads."""
    try:
        split = _require("huggingface_hub").split_torch_state_dict_into_shards(tensors, max_shard_size=max_shard_size)
    except ValueError as error:  # an unparsable size ("5 gigs")
        raise ConfigError(f"--max-shard-size {max_shard_size}: {error}: pass a size such as 5GB or 500MB") from None
    for filename, names in split.filename_to_tensors.items():
        _save({name: tensors[name] for name in names}, folder / filename, {"format": "pt"})
    if split.is_sharded:
        (folder / INDEX).write_text(json.dumps({"metadata": split.metadata, "weight_map": split.tensor_to_filename}, indent=2) + "\n")


class _staging:
    """A sibling temporary folder that replaces `out` only when the block completes."""

    def __init__(self, out: Path):
        self.out = out

    def __enter__(self) -> Path:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.stage = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", dir=self.out.parent))
        return self.stage

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is not None:
            shutil.rmtree(self.stage, ignore_errors=True)
            return
        if self.out.exists():
            shutil.rmtree(self.out)
        self.stage.rename(self.out)
