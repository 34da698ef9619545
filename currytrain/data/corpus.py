"""Token corpora. Each holds a train and a val token stream and cuts batches from them.

Batches are a pure function of (seed, split, step, microbatch): no sampler state to save, so a resumed
run sees exactly the batches the uninterrupted run would have seen. Data-parallel ranks each take a
disjoint, contiguous slice of that one global batch, so the batch (and the loss curve) does not depend on
how many ranks share it.
"""

from __future__ import annotations

import logging
import os
import sysconfig
from pathlib import Path

import torch

from currytrain.data.base import BYTE_VOCAB, stable_seed
from currytrain.data.files import find_text_files, plan_split
from currytrain.data.streams import MixedStream, windows
from currytrain.errors import ConfigError

log = logging.getLogger(__name__)


class TokenCorpus:
    """Train/val token streams plus deterministic random-window batching. A stream is a 1-D tensor, or a
    SpanStream or MixedStream (currytrain/data/streams.py) for corpora too large to hold in memory."""

    vocab_size: int = BYTE_VOCAB

    def __init__(self, train: torch.Tensor, val: torch.Tensor, seq_len: int, seed: int):
        if len(train) <= seq_len + 1 or len(val) <= seq_len + 1:
            raise ConfigError(
                f"data: the corpus is too small for data.seq_len={seq_len} (train {len(train)} tokens, val {len(val)} tokens): add text or lower data.seq_len"
            )
        self.train, self.val = train, val
        self.seq_len = seq_len
        self.seed = seed

    def batch(self, split: str, step: int, micro: int, batch_size: int, rank: int = 0, num_ranks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets of rank `rank`'s slice of the global batch of `batch_size` sequences,
        each (batch_size // num_ranks, seq_len) int64."""
        if not 0 <= rank < num_ranks or batch_size % num_ranks:
            raise ValueError(f"rank {rank} of {num_ranks}: the global batch of {batch_size} sequences must split evenly")
        stream = self.train if split == "train" else self.val
        # The trailing 0 keeps the batches of runs made before the batch was global (they seeded by rank 0).
        generator = torch.Generator().manual_seed(stable_seed(self.seed, split, step, micro, 0))
        share = batch_size // num_ranks
        mine = slice(rank * share, (rank + 1) * share)
        if isinstance(stream, MixedStream):
            tokens = stream.draw(generator, batch_size, self.seq_len + 1, mine)
        else:
            starts = torch.randint(len(stream) - self.seq_len - 1, (batch_size,), generator=generator)
            tokens = windows(stream, starts[mine], self.seq_len + 1)
        return tokens[:, :-1], tokens[:, 1:]

    def describe(self) -> dict:
        return {"train_tokens": len(self.train), "val_tokens": len(self.val), "vocab_size": self.vocab_size}


def _read_bytes(files: list[Path], budget: int) -> torch.Tensor:
    chunks, total = [], 0
    for path in files:
        if budget and total >= budget:
            break
        blob = path.read_bytes()
        if budget:
            blob = blob[: budget - total]
        chunks.append(blob)
        total += len(blob)
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8) if total else torch.zeros(0, dtype=torch.uint8)


def _split_bytes(files: list[Path], val_fraction: float, max_bytes: int, seed: int) -> dict:
    """Train/val byte streams, split by file before anything else touches the text."""
    plan = plan_split(files, val_fraction, max_bytes, seed)
    if plan.single_file_cut is not None:
        # One file cannot be split by file: hold out its tail instead.
        data = _read_bytes(files, plan.train_budget)
        cut = int(len(data) * plan.single_file_cut)
        return {"train": data[:cut], "val": data[cut:], "train_files": files, "val_files": files}
    return {
        "train": _read_bytes(plan.train_files, plan.train_budget),
        "val": _read_bytes(plan.val_files, plan.val_budget),
        "train_files": plan.train_files,
        "val_files": plan.val_files,
    }


class ByteCorpus(TokenCorpus):
    """Bytes of a set of files as tokens (vocab 256), split into train/val by file."""

    def __init__(self, files: list[Path], seq_len: int, val_fraction: float, max_bytes: int, seed: int):
        split = _split_bytes(files, val_fraction, max_bytes, seed)
        self.train_files, self.val_files = split["train_files"], split["val_files"]
        super().__init__(split["train"], split["val"], seq_len, seed)


class StdlibBytes(ByteCorpus):
    """Byte-level corpus of the running interpreter's own standard-library `.py` files (no download)."""

    def __init__(self, seq_len: int, val_fraction: float = 0.1, max_bytes: int = 16_000_000, seed: int = 0):
        root = Path(sysconfig.get_paths()["stdlib"])
        files = stdlib_sources(root)
        if not files:
            raise ConfigError(f"data=bytes: no .py files under the standard library at {root}: use data=text data.paths=[...]")
        super().__init__(files, seq_len, val_fraction, max_bytes, seed)
        log.info("stdlib corpus: %d files, %d train / %d val bytes", len(files), len(self.train), len(self.val))


def stdlib_sources(root: Path) -> list[Path]:
    """The `.py` files under `root`, not descending into site-packages (the installed packages there can be
    tens of thousands of files: walking them was 0.4 s of every run's start)."""
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name != "site-packages"]
        files += [Path(folder, name) for name in names if name.endswith(".py")]
    return [path for path in files if path.is_file()]


class TextFiles(ByteCorpus):
    """Byte-level corpus of the user's files and folders."""

    def __init__(
        self,
        paths: list[str],
        seq_len: int,
        suffixes: list[str] = (".txt", ".md", ".py"),
        val_fraction: float = 0.1,
        max_bytes: int = 0,
        seed: int = 0,
    ):
        files = collect_text_files(paths, suffixes)
        super().__init__(files, seq_len, val_fraction, max_bytes, seed)
        held_out = (
            f"the last {val_fraction:.0%} of the bytes (no set of whole files is near that share)"
            if self.val_files == self.train_files
            else f"{len(self.val_files)} whole files"
        )
        log.info("text corpus: %d files, %d train / %d val bytes; val: %s", len(files), len(self.train), len(self.val), held_out)


def collect_text_files(paths: list[str], suffixes) -> list[Path]:
    """Resolve data.paths into a list of non-empty files, or raise a ConfigError naming what is wrong."""
    files, problems = find_text_files(paths, suffixes)
    if problems:
        raise ConfigError("; ".join(problems))
    return files


class SyntheticTokens(TokenCorpus):
    """Uniform random tokens; loss cannot go below ln(vocab_size). For throughput benchmarks."""

    def __init__(self, seq_len: int, vocab_size: int = 256, num_tokens: int = 1_000_000, seed: int = 0):
        self.vocab_size = vocab_size
        generator = torch.Generator().manual_seed(seed)
        train = torch.randint(vocab_size, (num_tokens,), generator=generator, dtype=torch.int32)
        val = torch.randint(vocab_size, (max(num_tokens // 10, seq_len + 2),), generator=generator, dtype=torch.int32)
        super().__init__(train, val, seq_len, seed)
