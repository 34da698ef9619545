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

from collections.abc import Mapping
from typing import Any

import torch

from currytrain.data.corpus import TokenCorpus
from currytrain.data.prepare import PrepareOptions, dtype_for, split_spans
from currytrain.data.sources import Source, prepare_sources
from currytrain.data.streams import MixedStream, SpanStream
from currytrain.errors import ConfigError

__all__ = ["TokenizedText", "dtype_for"]

DOCUMENT_RULES = ("file", "paragraph")
"""How text is cut into documents (data.documents): one per file, or one per blank-line-separated paragraph."""
IN_MEMORY_TOKENS = 1 << 24
"""A split of at most this many tokens is read into memory (the ladder's leakage probes then compare the splits);
a larger one is read through memory maps, window by window."""


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
        restart_positions: bool = False,
        mask_documents: bool = False,
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
        self.document_boundaries = self._boundaries(restart_positions, mask_documents)

    def _boundaries(self, restart_positions: bool, mask_documents: bool) -> tuple[int, bool, bool] | None:
        """What the model is asked to respect (currytrain.model.protocol.apply_document_boundaries): (the EOS id
        that ends each document, restart positions, mask attention), or None."""
        if not (restart_positions or mask_documents):
            return None
        eos = {source.meta["eos_id"] for source in self.sources}
        if None in eos:
            raise ConfigError(
                "data.restart_positions / data.mask_documents find documents by the EOS after each, and data.eos_token adds none "
                "(its tokenizer_config.json names no eos_token, or eos_token=none): pass data.eos_token=<a token of the vocabulary>"
            )
        return (eos.pop(), restart_positions, mask_documents)

    def describe(self) -> dict:
        described = {**super().describe(), "token_cache": str(self.cache), "cache": "built" if self.built else "reused"}
        if len(self.sources) > 1:
            described["sources"] = {
                source.name: {"weight": source.weight, "token_cache": str(source.folder), "tokens": source.meta["num_tokens"]} for source in self.sources
            }
        return described
