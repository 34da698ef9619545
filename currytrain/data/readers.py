"""Reading a corpus as a stream of documents, in pieces that worker processes can take on their own.

A piece is a part of one file: a byte range of a JSON-lines or text file, a range of a Parquet file's row
groups, a whole Arrow file (its record batches are streamed). Nothing reads a whole file into memory:
JSON lines go line by line, Parquet by row group batches, Arrow by record batch, text in blocks.

Byte ranges own the records that start inside them, so consecutive pieces of one file yield exactly the
documents of the whole file, each once and in order:
- JSON lines: a record starts after a newline;
- paragraphs: a paragraph starts after the last newline of a blank-line separator (a run of whitespace that
  holds two newlines or more; whitespace is the ASCII kind, so bytes and text agree);
- a text file read as one document (data.documents=file) is one piece, read in blocks and encoded block by
  block, cut only at a newline between two non-space characters (see PIECEWISE_SAMPLES for when that is safe).

Bad input (text that is not UTF-8, a line that is not JSON, a record or table without the text field) raises
a ConfigError naming the file and its line (or row). Imports neither torch nor numpy.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from currytrain.errors import ConfigError

BLOCK = 8 << 20
"""Bytes read at a time from text files, and the largest piece of one document encoded at once."""
ROWS_PER_BATCH = 1024
"""Parquet rows decoded at a time."""
_SEPARATOR = re.compile(rb"\n\s*\n")
"""A paragraph separator: whitespace holding two newlines or more (bytes: \\s is ASCII whitespace)."""
PIECEWISE_SAMPLES = (("def f(x):\n", "return x\n"), ("The cat sat.\n", "It was happy."), ("a = 1\n", "b = 2\n"), ("x\n", "y"))
"""Texts cut at a newline whose two parts a tokenizer must encode as it encodes the whole, for a document longer
than BLOCK to be encoded block by block (byte-level BPE does; a tokenizer that adds a prefix space does not)."""


@dataclass(frozen=True)
class Piece:
    """A part of one input file, read on its own."""

    path: str
    kind: str
    """lines (JSON lines), paragraphs (text, one document per paragraph), file (text, one document), parquet, arrow."""
    start: int
    """First byte of the range (of the file, for parquet and arrow pieces: what data verify hashes)."""
    end: int
    row_groups: tuple[int, int] = (0, 0)
    """Parquet: the row groups [first, last) read."""

    @property
    def size(self) -> int:
        return self.end - self.start

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "row_groups": list(self.row_groups)}

    @staticmethod
    def from_dict(fields: dict[str, Any]) -> Piece:
        return Piece(**{**fields, "row_groups": tuple(fields.get("row_groups", (0, 0)))})


def kind_of(path: Path, documents: str) -> str:
    if path.suffix in (".parquet", ".arrow"):
        return path.suffix[1:]
    if path.suffix == ".jsonl":
        return "lines"
    return "paragraphs" if documents == "paragraph" else "file"


def plan_pieces(files: list[Path], documents: str, piece_bytes: int) -> list[Piece]:
    """The pieces of `files` (sorted by path) of about piece_bytes each, in document order."""
    pieces = []
    for path in sorted(files):
        size, kind = path.stat().st_size, kind_of(path, documents)
        if kind in ("lines", "paragraphs"):
            pieces += [Piece(str(path), kind, start, min(start + piece_bytes, size)) for start in range(0, size, piece_bytes)]
        elif kind == "parquet":
            pieces += _parquet_pieces(path, size, piece_bytes)
        else:
            pieces.append(Piece(str(path), kind, 0, size))
    return pieces


def _parquet_pieces(path: Path, size: int, piece_bytes: int) -> list[Piece]:
    """Runs of row groups of about piece_bytes (compressed) each; the file's bytes are shared among them for hashing."""
    metadata = _parquet_file(path).metadata
    groups, first, held = [], 0, 0
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        held += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        if held >= piece_bytes or index == metadata.num_row_groups - 1:
            groups.append((first, index + 1))
            first, held = index + 1, 0
    groups = groups or [(0, 0)]
    cuts = [size * k // len(groups) for k in range(len(groups) + 1)]
    return [Piece(str(path), "parquet", cuts[k], cuts[k + 1], groups[k]) for k in range(len(groups))]


def group_units(pieces: list[Piece], unit_bytes: int) -> list[list[Piece]]:
    """Consecutive pieces grouped into units of work (one shard each) of about unit_bytes: a large file's
    pieces are a unit each, small files share one."""
    units: list[list[Piece]] = []
    held = unit_bytes
    for piece in pieces:
        if held + piece.size > unit_bytes and held:
            units.append([])
            held = 0
        units[-1].append(piece)
        held += piece.size
    return units


@dataclass
class Segment:
    """Text read from a piece: a whole document, or a block of one that goes on (ends=False)."""

    text: str
    ends: bool
    position: int
    """Bytes of the piece read so far (for progress)."""
    origin: tuple[str, int] | None = None
    """(file, byte offset) of a JSON-lines record, to name its line when the tokenizer refuses it."""

    def where(self) -> str:
        return f"{self.origin[0]} line {line_number(*self.origin)}" if self.origin else "a document"


def read_piece(piece: Piece, text_field: str, piecewise: bool = True) -> Iterator[Segment]:
    """The documents of `piece`, in order; empty and blank ones are skipped. piecewise: whether a long text
    document may be cut into blocks (see PIECEWISE_SAMPLES); otherwise it is read whole."""
    if piece.kind == "file":
        return _file(piece, piecewise)
    return {"lines": _lines, "paragraphs": _paragraphs, "parquet": _parquet, "arrow": _arrow}[piece.kind](piece, text_field)


def read_documents(files: list[Path], documents: str, text_field: str = "text", piece_bytes: int = 64 << 20) -> Iterator[str]:
    """Every document of `files` whole, in the order a preparation reads them (files sorted by path)."""
    held: list[str] = []
    for piece in plan_pieces(files, documents, piece_bytes):
        for segment in read_piece(piece, text_field, piecewise=False):
            held.append(segment.text)
            if segment.ends:
                yield "".join(held)
                held = []
    if held:
        yield "".join(held)


def _decode(data: bytes, path: str, offset: int) -> str:
    """`data` (read at byte `offset` of `path`) as text, or a ConfigError naming the file and line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = line_number(path, offset + error.start)
        raise ConfigError(
            f"data.paths: {path} line {line} is not UTF-8 text ({error.reason} at byte {offset + error.start}): fix or remove the file, or narrow data.suffixes"
        ) from None


def line_number(path: str, offset: int) -> int:
    """The 1-based line of `path` holding byte `offset` (read on the error path only)."""
    count, read = 1, 0
    with open(path, "rb") as handle:
        while read < offset:
            block = handle.read(min(BLOCK, offset - read))
            if not block:
                break
            count += block.count(b"\n")
            read += len(block)
    return count


def _lines(piece: Piece, text_field: str) -> Iterator[Segment]:
    with open(piece.path, "rb") as handle:
        position = _line_start(handle, piece.start)
        while position < piece.end:
            line = handle.readline()
            if not line:
                break
            offset, position = position, position + len(line)
            if not line.strip():
                continue
            text = _record_text(line, piece.path, offset, text_field)
            if text.strip():
                yield Segment(text, True, position - piece.start, (piece.path, offset))


def _line_start(handle: Any, start: int) -> int:
    """Seek `handle` to the first line that starts at or after byte `start`; returns its offset."""
    if start == 0:
        return 0
    handle.seek(start - 1)
    if handle.read(1) == b"\n":
        return start
    return start + len(handle.readline())


def _record_text(line: bytes, path: str, offset: int, text_field: str) -> str:
    """The `text_field` string of the JSON record `line` (at byte `offset` of `path`), or a ConfigError naming the line."""
    try:
        record = json.loads(line)
    except UnicodeDecodeError as error:
        raise ConfigError(f"data.paths: {path} line {line_number(path, offset)} is not UTF-8 text ({error.reason}): fix or remove the file") from None
    except ValueError as error:
        raise ConfigError(f"data.paths: {path} line {line_number(path, offset)} is not JSON ({error.msg}): fix the file or remove it from data.paths") from None
    value = record.get(text_field) if isinstance(record, dict) else None
    if not isinstance(value, str):
        keys = sorted(record)[:8] if isinstance(record, dict) else type(record).__name__
        raise ConfigError(
            f"data.text_field={text_field}: {path} line {line_number(path, offset)} has no string field {text_field!r} (it has {keys}): "
            "pass data.text_field=<the field holding the text>"
        )
    return value


def paragraph_cut(handle: Any, position: int, size: int) -> int:
    """The first place at or after byte `position` where a paragraph starts: just past the last newline of the
    next separator (0 at the start of the file, `size` when no separator follows)."""
    if position == 0:
        return 0
    window = b""
    while True:
        handle.seek(position)
        window = handle.read(len(window) + BLOCK)
        found = _SEPARATOR.search(window)
        at_end = position + len(window) >= size
        # The separator's whitespace may go on past the window (more newlines): read on until it is closed.
        if found and (window[found.end() :].strip() or at_end):
            return position + found.end()
        if at_end:
            return size


def _paragraphs(piece: Piece, _: str) -> Iterator[Segment]:
    with open(piece.path, "rb") as handle:
        size = handle.seek(0, 2)
        begin = paragraph_cut(handle, piece.start, size)
        stop = paragraph_cut(handle, piece.end, size) if piece.end < size else size
        handle.seek(begin)
        carry, offset = b"", begin  # offset: the file position of carry's first byte
        while offset + len(carry) < stop:
            block = handle.read(min(BLOCK, stop - offset - len(carry)))
            if not block:
                break
            carry += block
            cut = _complete_paragraphs(carry)
            if cut:
                yield from _split_paragraphs(carry[:cut], piece, offset, offset + cut)
                carry, offset = carry[cut:], offset + cut
        yield from _split_paragraphs(carry, piece, offset, offset + len(carry))


def _complete_paragraphs(buffer: bytes) -> int:
    """Bytes of `buffer` that end at a closed separator (one followed by text in the buffer), 0 if none."""
    last_text = len(buffer.rstrip())
    cut = 0
    for found in _SEPARATOR.finditer(buffer):
        if found.end() <= last_text:
            cut = found.end()
    return cut


def _split_paragraphs(data: bytes, piece: Piece, offset: int, position: int) -> Iterator[Segment]:
    """The paragraphs of `data`, read at byte `offset` of the piece's file; `position`: where reading stands."""
    start = 0
    for found in [*_SEPARATOR.finditer(data), None]:
        end = found.start() if found else len(data)
        if data[start:end].strip():
            yield Segment(_decode(data[start:end], piece.path, offset + start), True, position - piece.start)
        start = found.end() if found else end


def piecewise_safe(tokenizer: Any) -> bool:
    """Whether `tokenizer` encodes texts cut at a newline as it encodes them whole (PIECEWISE_SAMPLES)."""
    for left, right in PIECEWISE_SAMPLES:
        whole = tokenizer.encode(left + right, add_special_tokens=False).ids
        if whole != tokenizer.encode(left, add_special_tokens=False).ids + tokenizer.encode(right, add_special_tokens=False).ids:
            return False
    return True


def _file(piece: Piece, piecewise: bool) -> Iterator[Segment]:
    """A text file as one document: whole when small or when the tokenizer cannot be fed pieces, else in blocks
    cut at a newline between two non-space characters."""
    with open(piece.path, "rb") as handle:
        if not piecewise or piece.size <= BLOCK:
            text = _decode(handle.read(), piece.path, 0)
            if text.strip():
                yield Segment(text, True, piece.size)
            return
        carry, offset, any_text = b"", 0, False
        while block := handle.read(BLOCK):
            carry += block
            cut = _last_line_cut(carry)
            if not cut:
                continue  # no place to cut in a whole block: read on
            any_text = any_text or bool(carry[:cut].strip())
            yield Segment(_decode(carry[:cut], piece.path, offset), False, offset + cut)
            carry, offset = carry[cut:], offset + cut
        any_text = any_text or bool(carry.strip())
        # The document ends here (an empty last block still closes it, when earlier blocks held text).
        if any_text:
            yield Segment(_decode(carry, piece.path, offset), True, piece.size)


def _last_line_cut(buffer: bytes) -> int:
    """Just past the last newline of `buffer` between two non-space characters, 0 if there is none."""
    at = len(buffer) - 1
    while (at := buffer.rfind(b"\n", 0, at)) > 0:
        if not buffer[at - 1 : at].isspace() and not buffer[at + 1 : at + 2].isspace():
            return at + 1
    return 0


def _parquet_file(path: Path | str) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"data.paths: reading {path} needs pyarrow: pip install 'currytrain[parquet]'") from None
    try:
        return pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises ArrowInvalid/OSError subclasses for unreadable files
        raise ConfigError(f"data.paths: {path} is not a readable Parquet file ({type(error).__name__}: {error}): fix or remove it") from None


def _check_column(schema: Any, path: str, text_field: str) -> None:
    if text_field not in schema.names:
        raise ConfigError(
            f"data.text_field={text_field}: {path} has no column {text_field!r} (it has {schema.names[:8]}): pass data.text_field=<the text column>"
        )
    kind = schema.field(text_field).type
    if str(kind) not in ("string", "large_string"):
        raise ConfigError(f"data.text_field={text_field}: the column of {path} holds {kind}, not text: pass data.text_field=<the text column>")


def _parquet(piece: Piece, text_field: str) -> Iterator[Segment]:
    """Rows of the piece's row groups, ROWS_PER_BATCH at a time."""
    parquet = _parquet_file(piece.path)
    _check_column(parquet.schema_arrow, piece.path, text_field)
    first, last = piece.row_groups
    total = sum(parquet.metadata.row_group(g).num_rows for g in range(first, last)) or 1
    done = 0
    for batch in parquet.iter_batches(batch_size=ROWS_PER_BATCH, row_groups=list(range(first, last)), columns=[text_field]):
        done += batch.num_rows
        yield from _rows(batch.column(0).to_pylist(), piece.size * done // total)


def _rows(texts: list[str | None], position: int) -> Iterator[Segment]:
    for text in texts:
        if text and text.strip():
            yield Segment(text, True, position)


def _arrow(piece: Piece, text_field: str) -> Iterator[Segment]:
    """An Arrow file (what Hugging Face `datasets` writes: the IPC stream format; the file format is read too),
    record batch by record batch, memory-mapped: offline, no `datasets` import."""
    try:
        import pyarrow as pa
    except ImportError:
        raise ConfigError(f"data.paths: reading {piece.path} needs pyarrow: pip install 'currytrain[parquet]'") from None
    with pa.memory_map(piece.path) as source:
        batches, schema = _open_arrow(pa, source, piece.path)
        _check_column(schema, piece.path, text_field)
        for batch in batches:
            yield from _rows(batch.column(text_field).to_pylist(), source.tell())


def _open_arrow(pa: Any, source: Any, path: str) -> tuple[Iterator[Any], Any]:
    try:
        reader = pa.ipc.open_stream(source)
        return iter(reader), reader.schema
    except (pa.ArrowInvalid, OSError):
        source.seek(0)
    try:
        reader = pa.ipc.open_file(source)
        return (reader.get_batch(i) for i in range(reader.num_record_batches)), reader.schema
    except (pa.ArrowInvalid, OSError) as error:
        raise ConfigError(f"data.paths: {path} is not a readable Arrow file ({type(error).__name__}: {error}): fix or remove it") from None


def hash_range(path: str, start: int, end: int) -> str:
    """blake2b of bytes [start, end) of `path` (what data verify compares)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        handle.seek(start)
        left = end - start
        while left > 0:
            block = handle.read(min(BLOCK, left))
            if not block:
                break
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()
