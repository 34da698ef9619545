"""data=tokens: text tokenized once by a local tokenizer into a sharded token cache, then streamed by every run.

The text is cut into documents (whole files, blank-line-separated paragraphs, the records of .jsonl files, the
rows of .parquet and .arrow files: Hugging Face `datasets` folders, offline). Preparing a corpus
(currytrain/data/prepare.py) streams it through worker processes into shards of token ids, each document
encoded on its own and followed by the EOS id; the tokenizer is never fitted on the data. One process prepares
a missing cache while the others wait for it; a run whose cache is there reads only its manifest.

The documents are then split into train and val (a seeded draw of whole documents, so none contributes to
both), and batches are random windows of each split's stream. With data.sources, several corpora are prepared
apart and mixed by weight, window by window.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from currytrain.data.corpus import TokenCorpus, collect_text_files
from currytrain.data.prepare import META, CorpusSpec, PrepareOptions, cache_problems, dtype_for, ensure_cache, split_spans
from currytrain.data.streams import MixedStream, SpanStream
from currytrain.data.tokenizer import eos_id, find_tokenizer, load_tokenizer
from currytrain.errors import ConfigError

__all__ = ["TokenizedText", "dtype_for", "prepare_sources"]

log = logging.getLogger(__name__)

DOCUMENT_RULES = ("file", "paragraph")
"""How text is cut into documents (data.documents): one per file, or one per blank-line-separated paragraph."""
IN_MEMORY_TOKENS = 1 << 24
"""A split of at most this many tokens is read into memory (the ladder's leakage probes then compare the splits);
a larger one is read through memory maps, window by window."""


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
        files = collect_text_files(paths if path is None else [path], suffixes)
        spec = CorpusSpec(tuple(files), tokenizer_path, eos, documents, field)
        folder, built = ensure_cache(spec, Path(cache_dir).expanduser(), options)
        prepared.append(Source(name, weight, folder, built, _trusted_meta(folder)))
        if not built:
            log.info("token cache reused: %s", folder)
    return prepared


def _trusted_meta(folder: Path) -> dict[str, Any]:
    """meta.json of a finished cache whose shards are all there, whole; else a ConfigError naming the file."""
    fix = "run `currytrain data prepare <the same overrides>` (it redoes the damaged shards), or remove the folder"
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"data: the token cache {folder} cannot be trusted: {folder / META} cannot be read ({error}): {fix}") from None
    problems = cache_problems(folder, meta)
    if problems:
        raise ConfigError(f"data: the token cache {folder} cannot be trusted: {problems[0]}: {fix}")
    return meta


def _split_streams(source: Source, seed: int, val_fraction: float) -> tuple[torch.Tensor | SpanStream, ...]:
    spans = split_spans(source.folder, source.meta, seed, val_fraction)
    streams = [SpanStream(source.folder, spans[split], source.meta["dtype"]) for split in ("train", "val")]
    return tuple(stream.tensor() if len(stream) <= IN_MEMORY_TOKENS else stream for stream in streams)


class TokenizedText(TokenCorpus):
    """Text files tokenized by a local tokenizer, prepared once into a token cache, batched as random windows (see
    TokenCorpus); with `sources`, several corpora mixed by weight."""

    def __init__(
        self,
        tokenizer: str,
        paths: list[str],
        seq_len: int,
        suffixes: list[str] = (".txt", ".md", ".jsonl", ".parquet", ".arrow"),
        documents: str = "file",
        text_field: str = "text",
        eos_token: str = "auto",
        cache_dir: str = "runs/token_cache",
        val_fraction: float = 0.1,
        seed: int = 0,
        sources: Mapping[str, Mapping[str, Any]] | None = None,
        workers: int = 0,
        shard_mb: int = 128,
        prepare_wait: float = 600.0,
    ):
        options = PrepareOptions(workers=workers, shard_bytes=shard_mb << 20, wait_s=prepare_wait)
        self.sources = prepare_sources(tokenizer, paths, sources, list(suffixes), documents, text_field, eos_token, cache_dir, options)
        self.vocab_size = self.sources[0].meta["vocab_size"]
        self.cache, self.built = self.sources[0].folder, any(source.built for source in self.sources)
        streams = [_split_streams(source, seed, val_fraction) for source in self.sources]
        for source, (train, val) in zip(self.sources, streams):
            if min(len(train), len(val)) <= seq_len + 1 and len(self.sources) > 1:
                raise ConfigError(
                    f"data.sources.{source.name} is too small for data.seq_len={seq_len} (train {len(train)} tokens, val {len(val)} tokens): "
                    "add text to it or lower data.seq_len"
                )
        if len(streams) == 1:
            train, val = streams[0]
        else:
            weights = [source.weight for source in self.sources]
            train, val = MixedStream([s[0] for s in streams], weights), MixedStream([s[1] for s in streams], weights)
        super().__init__(train, val, seq_len, seed)

    def describe(self) -> dict:
        described = {**super().describe(), "token_cache": str(self.cache), "cache": "built" if self.built else "reused"}
        if len(self.sources) > 1:
            described["sources"] = {
                source.name: {"weight": source.weight, "token_cache": str(source.folder), "tokens": source.meta["num_tokens"]} for source in self.sources
            }
        return described


def _sources_of(fields: dict[str, Any], options: PrepareOptions) -> list[Source]:
    """The prepared sources of data=tokens fields (a resolved data config node as a dict)."""
    target = f"{TokenizedText.__module__}.{TokenizedText.__qualname__}"
    if fields.get("_target_") != target:
        raise ConfigError(
            f"currytrain data prepares data=tokens (a tokenizer and text files); data builds {fields.get('_target_')}, which reads its data "
            "when a run starts: pass data=tokens data.tokenizer=... data.paths=[...]"
        )
    keys = ("tokenizer", "paths", "sources", "suffixes", "documents", "text_field", "eos_token", "cache_dir")
    return prepare_sources(*(fields[key] for key in keys), options)


def prepare_data(fields: dict[str, Any]) -> list[str]:
    """`currytrain data prepare`: prepare every source's cache (mending a damaged one) and cut the split of
    data.seed and data.val_fraction, so that runs start without tokenizing; returns what to print."""
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
    from currytrain.data.prepare import input_problems

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
