"""Typed configs of the data group (conf/data/)."""

from __future__ import annotations

from dataclasses import dataclass, field

BYTE_VOCAB = 256
"""Vocabulary of the byte-level corpora: token id = byte value."""


@dataclass
class ByteCorpusConfig:
    """Fields of every byte-level corpus (vocab 256, split into train/val by file)."""

    _target_: str = "???"
    seq_len: int = "${model.max_seq_len}"  # type: ignore[assignment]
    """Tokens per training sequence (bytes)."""
    val_fraction: float = 0.1
    """Share of the files (not bytes) held out for validation, chosen before any processing;
    a single file is split at that byte offset instead."""
    max_bytes: int = 0
    """Cap on the bytes read (train and val share it in proportion); 0 reads everything."""
    seed: int = "${seed}"  # type: ignore[assignment]
    """Seed of the file split and of batch sampling."""


@dataclass
class StdlibBytesConfig(ByteCorpusConfig):
    """The embedded default corpus: the bytes of the running interpreter's standard-library sources."""

    _target_: str = "currytrain.data.corpus.StdlibBytes"
    max_bytes: int = 16_000_000


@dataclass
class TextConfig(ByteCorpusConfig):
    """The user's own text files or folders, byte-level (vocab 256)."""

    _target_: str = "currytrain.data.corpus.TextFiles"
    paths: list[str] = field(default_factory=list)
    """Files or folders to read; folders are searched recursively for `suffixes`."""
    suffixes: list[str] = field(default_factory=lambda: [".txt", ".md", ".py"])
    """File endings read from folders (files named directly are always read)."""


@dataclass
class SyntheticConfig:
    """Uniform random tokens: no signal to learn, for throughput benchmarks."""

    _target_: str = "currytrain.data.corpus.SyntheticTokens"
    vocab_size: int = 256
    """Token ids are drawn uniformly from [0, vocab_size)."""
    seq_len: int = "${model.max_seq_len}"  # type: ignore[assignment]
    """Tokens per training sequence."""
    num_tokens: int = 1_000_000
    """Length of the generated token stream (train); val gets a tenth of it."""
    seed: int = "${seed}"  # type: ignore[assignment]
    """Seed of the generated stream and of batch sampling."""
