"""The shards of a token cache: each unit of input pieces encoded into one file of token ids, written atomically.

    shard-000042.bin    the ids of the unit's documents back to back, each followed by the EOS id
    shard-000042.idx    the end offset of each document in the .bin (int64, .npy format)
    shard-000042.json   the record: tokens, documents, input bytes, the .bin's checksum and each input range
                        with the hash of its bytes. Written last, by rename: a shard without it is unfinished.

`python -m currytrain.data.shards` is one worker process of a parallel preparation (currytrain.data.prepare):
it reads a job, then units, as JSON lines on stdin and answers with progress, done and error lines on stdout.
Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from currytrain.data.readers import Piece, Segment, hash_range, read_piece
from currytrain.errors import ConfigError

BATCH_DOCS = 256
"""Documents (or blocks of one) encoded per call of the tokenizer."""
BATCH_CHARS = 1 << 20
"""Characters of text encoded per call at most: the encodings of a batch (ids, offsets, token strings) take about
100 bytes a token, so this bounds a worker's memory whatever the documents' lengths."""
REPORT_EVERY_S = 0.5
"""How often a unit's progress is reported (seconds)."""

Report = Callable[[int, int, int], None]
"""(bytes, documents, tokens) read and encoded since the last report."""


def shard_name(index: int) -> str:
    return f"shard-{index:06d}"


class _Writer:
    """The .bin of one shard being written under a temporary name, with its checksum and document ends."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype = path, dtype
        self.handle = path.open("wb")
        self.digest = hashlib.blake2b(digest_size=16)
        self.ends: list[int] = []
        self.tokens = 0

    def write(self, ids: np.ndarray) -> None:
        ids.tofile(self.handle)
        self.digest.update(memoryview(ids))
        self.tokens += len(ids)

    def end_document(self) -> None:
        self.ends.append(self.tokens)

    def close(self) -> None:
        self.handle.close()


class _Encoder:
    """Segments batched into encode_batch calls; each document's ids then its EOS go to the writer."""

    def __init__(self, tokenizer: Any, eos: int | None, writer: _Writer, report: Callable[[int, int], None]):
        self.tokenizer, self.writer, self.report = tokenizer, writer, report
        # encode_batch_fast (tokenizers >= 0.20): the same ids, without computing offsets.
        self.encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        self.eos = np.array([] if eos is None else [eos], dtype=writer.dtype)
        self.pending: list[Segment] = []
        self.chars = 0
        self.open = False  # a document whose blocks are still coming

    def add(self, segment: Segment) -> None:
        self.pending.append(segment)
        self.chars += len(segment.text)
        if len(self.pending) >= BATCH_DOCS or self.chars >= BATCH_CHARS:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        try:
            encodings = self.encode([segment.text for segment in self.pending], add_special_tokens=False)
        except Exception as error:  # the library raises TypeError and others for text it cannot take
            raise self.refused(error) from None
        parts, ends, start = [], [], self.writer.tokens
        position = start
        for segment, encoding in zip(self.pending, encodings):
            parts.append(np.asarray(encoding.ids, dtype=self.writer.dtype))
            position += len(parts[-1])
            self.open = not segment.ends
            if segment.ends:
                parts.append(self.eos)
                position += len(self.eos)
                ends.append(position)
        self.writer.write(np.concatenate(parts))
        self.writer.ends += ends
        self.report(len(ends), position - start)
        self.pending, self.chars = [], 0

    def refused(self, error: Exception) -> Exception:
        """A ConfigError naming the document the tokenizer refused (text that is not valid Unicode: a JSON escape
        of half a surrogate pair), or `error` itself when no document alone explains it."""
        for segment in self.pending:
            try:
                segment.text.encode("utf-8")
            except UnicodeEncodeError as bad:
                return ConfigError(
                    f"data.paths: {segment.where()} holds text that is not valid Unicode ({bad.reason}: {segment.text[bad.start : bad.end]!r} at "
                    f"character {bad.start}), which the tokenizer cannot take: fix the record (a lone surrogate escape such as \\ud800) or remove the file"
                )
        return error

    def close(self) -> None:
        """The unit's last batch; a document still open (its file ended in blank blocks) is closed."""
        self.flush()
        if self.open:
            self.writer.write(self.eos)
            self.writer.end_document()
            self.open = False


class _Progress:
    """Progress of one unit, sent at most every REPORT_EVERY_S seconds."""

    def __init__(self, report: Report, pieces: list[Piece]):
        self.report, self.pieces = report, pieces
        self.sent = [0, 0, 0]
        self.now = [0, 0, 0]
        self.piece_base = 0
        self.last = time.monotonic()

    def position(self, position: int) -> None:
        self.now[0] = self.piece_base + position

    def encoded(self, docs: int, tokens: int) -> None:
        self.now[1] += docs
        self.now[2] += tokens
        if time.monotonic() - self.last >= REPORT_EVERY_S:
            self.send()

    def send(self) -> None:
        delta = [now - sent for now, sent in zip(self.now, self.sent)]
        if any(delta):
            self.report(*delta)
        self.sent, self.last = list(self.now), time.monotonic()


def encode_unit(
    index: int, pieces: list[Piece], tokenizer: Any, eos: int | None, dtype: np.dtype, folder: Path, text_field: str, piecewise: bool, report: Report
) -> dict[str, Any]:
    """Encode the documents of `pieces` into shard `index` of `folder`; returns its record (also written as
    <shard>.json, last). Bad input raises a ConfigError naming the file and line; nothing of the shard stays."""
    name, suffix = shard_name(index), f".{os.getpid()}.tmp"
    bin_tmp, idx_tmp = folder / f"{name}.bin{suffix}", folder / f"{name}.idx{suffix}"
    writer = _Writer(bin_tmp, dtype)
    progress = _Progress(report, pieces)
    try:
        encoder = _Encoder(tokenizer, eos, writer, progress.encoded)
        for piece in pieces:
            for segment in read_piece(piece, text_field, piecewise):
                progress.position(min(segment.position, piece.size))  # a piece's last record may run past its end
                encoder.add(segment)
            encoder.flush()
            progress.piece_base += piece.size
            progress.position(0)
        encoder.close()
        writer.close()
        with idx_tmp.open("wb") as handle:
            np.save(handle, np.asarray(writer.ends, dtype=np.int64))
        inputs = [{**piece.as_dict(), "hash": hash_range(piece.path, piece.start, piece.end)} for piece in pieces]
        record = {
            "index": index,
            "tokens": writer.tokens,
            "docs": len(writer.ends),
            "bytes": sum(piece.size for piece in pieces),
            "checksum": writer.digest.hexdigest(),
            "inputs": inputs,
        }
        os.replace(bin_tmp, folder / f"{name}.bin")
        os.replace(idx_tmp, folder / f"{name}.idx")
        write_json(folder / f"{name}.json", record)
    finally:
        writer.close()
        for path in (bin_tmp, idx_tmp):
            path.unlink(missing_ok=True)
    progress.send()
    return record


def write_json(path: Path, value: Any) -> None:
    """`value` as JSON at `path`, written under a temporary name and renamed: readers see all of it or nothing."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(tmp, path)


def shard_problem(folder: Path, record: dict[str, Any], itemsize: int, deep: bool = False) -> str | None:
    """Why shard `record` of `folder` cannot be trusted (a missing or cut file, a wrong count), or None.
    Sizes are checked from the file system alone; deep also checks the checksum of every id."""
    name = shard_name(record["index"])
    data, index = folder / f"{name}.bin", folder / f"{name}.idx"
    if not data.is_file() or not index.is_file():
        return f"{data if not data.is_file() else index} is missing"
    if data.stat().st_size != record["tokens"] * itemsize:
        return f"{data} holds {data.stat().st_size} bytes, its record says {record['tokens']} tokens of {itemsize} bytes"
    try:
        ends = np.load(index, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        return f"{index} cannot be read ({error})"
    if ends.shape != (record["docs"],) or (len(ends) and int(ends[-1]) != record["tokens"]):
        return f"{index} does not match {data} (document ends {ends.shape}, its record says {record['docs']} documents of {record['tokens']} tokens)"
    if deep and checksum(data) != record["checksum"]:
        return f"{data} does not match its checksum: its ids changed since it was written"
    return None


def checksum(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with path.open("rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def worker_main() -> int:
    """A worker process: the job on stdin's first line, then one unit per line until stdin closes."""
    from tokenizers import Tokenizer

    job = json.loads(sys.stdin.readline())
    tokenizer = Tokenizer.from_file(job["tokenizer"])
    parent = os.getppid()

    def report(*delta: int) -> None:
        if os.getppid() != parent:  # the preparing process died: stop, its successor redoes this unit
            os._exit(1)
        _send({"progress": delta})

    for line in sys.stdin:
        unit = json.loads(line)
        pieces = [Piece.from_dict(piece) for piece in unit["pieces"]]
        try:
            record = encode_unit(
                unit["index"], pieces, tokenizer, job["eos"], np.dtype(job["dtype"]), Path(job["folder"]), job["text_field"], job["piecewise"], report
            )
        except ConfigError as error:
            _send({"error": str(error)})
            return 2
        _send({"done": unit["index"], "record": record})
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
