"""The corpora of a data=tokens run (data.paths, or each of data.sources) and their token caches: found from the
manifest, prepared where missing, refused where damaged; and what `currytrain data prepare|verify` do with them.
Imports no torch, so the command starts in the time Hydra takes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from currytrain.data.config import TokensConfig
from currytrain.data.files import find_text_files
from currytrain.data.prepare import META, CorpusSpec, PrepareOptions, cache_problems, ensure_cache, input_problems, meta_problem, split_spans
from currytrain.data.tokenizer import eos_id, find_tokenizer, load_tokenizer
from currytrain.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class Source:
    """One prepared corpus of a run: its cache folder and what it weighs in the mixture."""

    name: str
    weight: float
    folder: Path
    built: bool
    meta: dict[str, Any]


def prepare_sources(
    tokenizer: str,
    paths: list[str],
    sources: Mapping[str, Mapping[str, Any]] | None,
    suffixes: list[str],
    documents: str,
    text_field: str,
    eos_token: str,
    cache_dir: str,
    options: PrepareOptions,
) -> list[Source]:
    """The token cache of data.paths (or of each of data.sources), prepared where it is missing, and checked."""
    tokenizer_path, problem = find_tokenizer(tokenizer)
    if problem:
        raise ConfigError(problem)
    eos = eos_id(load_tokenizer(tokenizer_path), tokenizer_path, eos_token)
    named = {name: (str(source["path"]), float(source.get("weight", 1.0)), source.get("text_field") or text_field) for name, source in (sources or {}).items()}
    if not named:
        named = {"data": (None, 1.0, text_field)}
    prepared = []
    for name, (path, weight, field) in named.items():
        files, problems = find_text_files(paths if path is None else [path], suffixes)
        if problems:
            raise ConfigError("; ".join(problems))
        spec = CorpusSpec(tuple(files), tokenizer_path, eos, documents, field)
        folder, built = ensure_cache(spec, Path(cache_dir).expanduser(), options)
        prepared.append(Source(name, weight, folder, built, _trusted_meta(folder)))
        if not built:
            log.info("token cache reused: %s", folder)
    return prepared


def _trusted_meta(folder: Path) -> dict[str, Any]:
    """meta.json of a finished cache whose shards are all there, whole; else a ConfigError naming the file. Sizes
    and shapes only: a cache is read as data (ids, JSON, .npy without pickle), never run."""
    fix = "run `currytrain data prepare <the same overrides>` (it redoes the damaged shards), or remove the folder"
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"data: the token cache {folder} (data.cache_dir) is damaged: {folder / META} cannot be read ({error}): {fix}") from None
    problems = [problem] if (problem := meta_problem(meta)) else cache_problems(folder, meta)
    if problems:
        raise ConfigError(f"data: the token cache {folder} (data.cache_dir) is damaged: {problems[0]}: {fix}")
    return meta


def _require_tokens(fields: dict[str, Any]) -> None:
    if fields.get("_target_") != TokensConfig._target_:
        raise ConfigError(
            f"currytrain data prepares data=tokens (a tokenizer and text files); data builds {fields.get('_target_')}, which reads its data "
            "when a run starts: pass data=tokens data.tokenizer=... data.paths=[...]"
        )


def _sources_of(fields: dict[str, Any], options: PrepareOptions) -> list[Source]:
    """The prepared sources of data=tokens fields (a resolved data config node as a dict)."""
    _require_tokens(fields)
    keys = ("tokenizer", "paths", "sources", "suffixes", "documents", "text_field", "eos_token", "cache_dir")
    return prepare_sources(*(fields[key] for key in keys), options)


def prepare_data(fields: dict[str, Any]) -> list[str]:
    """`currytrain data prepare`: prepare every source's cache (mending a damaged one) and cut the split of
    data.seed and data.val_fraction, so that runs start without tokenizing; returns what to print."""
    _require_tokens(fields)  # before reading the fields only data=tokens has
    options = PrepareOptions(workers=fields["workers"], shard_bytes=fields["shard_mb"] << 20, wait_s=fields["prepare_wait"], repair=True)
    lines = []
    for source in _sources_of(fields, options):
        spans = split_spans(source.folder, source.meta, fields["seed"], fields["val_fraction"])
        meta = source.meta
        sizes = {name: int((spans[name][:, 2] - spans[name][:, 1]).sum()) for name in spans}
        lines.append(
            f"{source.name}: {source.folder} ({'prepared now' if source.built else 'ready'}): {len(meta['shards'])} shards, "
            f"{meta['num_docs']:,} documents, {meta['num_tokens']:,} tokens ({meta['dtype']}); split seed {fields['seed']}: "
            f"{sizes['train']:,} train / {sizes['val']:,} val tokens"
        )
    return lines


def verify_data(fields: dict[str, Any]) -> list[str]:
    """`currytrain data verify`: every shard's ids against their checksums and every input byte against the hashes
    taken when the cache was prepared; a ConfigError naming each problem, else what to print."""
    options = PrepareOptions(existing=True)
    lines, problems = [], []
    for source in _sources_of(fields, options):
        found = cache_problems(source.folder, source.meta, deep=True) + input_problems(source.meta)
        problems += [f"{source.name}: {problem}" for problem in found]
        lines.append(f"{source.name}: {source.folder}: {'ok' if not found else f'{len(found)} problem(s)'}")
    if problems:
        raise ConfigError(
            "data verify found problems:\n  - " + "\n  - ".join(problems) + "\nrun `currytrain data prepare <the same overrides>` to redo damaged shards; "
            "a changed input file gets a new cache when its size or time changed, else remove the cache folder"
        )
    return lines
