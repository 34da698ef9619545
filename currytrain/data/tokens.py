"""data=tokens: text files tokenized once by a local tokenizer into a memory-mapped token cache.

The text is cut into documents (whole files, blank-line-separated paragraphs, or the records of .jsonl
files, the rows of .parquet and .arrow files: Hugging Face `datasets` folders, offline) and the documents are
split into train and val before anything is tokenized, so no document contributes tokens to both. The
tokenizer is never fitted on the data; each document is encoded on its own and followed by the EOS id.

Cache layout, under data.cache_dir:

    <key>/                 key: hash of tokenizer.json, the EOS id, the document rule and every file's bytes
      tokens.bin           all documents' ids back to back, uint16 (vocab <= 65536) or uint32
      docs.npy             (num_docs, 2) start/end offset of each document in tokens.bin
      meta.json            tokenizer, files and their hashes, dtype, counts
      split-<seed>-<val_fraction>/train.bin, val.bin    the two streams of one split, memory-mapped by runs

A changed file or tokenizer changes the key, so the cache is rebuilt; an unchanged one is reused
without tokenizing. Folders are written under a temporary name and renamed into place, so an
interrupted build leaves nothing half-written, and concurrent workers agree on one copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from currytrain.data.corpus import TokenCorpus, collect_text_files
from currytrain.data.files import split_files
from currytrain.data.tokenizer import eos_id, find_tokenizer, load_tokenizer, vocab_size_of
from currytrain.errors import ConfigError

log = logging.getLogger(__name__)

DOCUMENT_RULES = ("file", "paragraph")
"""How text is cut into documents (data.documents): one per file, or one per blank-line-separated paragraph."""
ENCODE_CHUNK = 256
"""Documents encoded per tokenizers batch call (it parallelises inside a batch)."""
_PARAGRAPH = re.compile(r"\n\s*\n")


def dtype_for(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type that holds every id."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def read_documents(files: list[Path], documents: str, text_field: str = "text") -> list[str]:
    """The documents of `files` in a fixed order (files sorted by path, then their paragraphs or records).
    A .jsonl file holds one document per line, in the string field `text_field` of each JSON object."""
    docs = []
    for path in sorted(files):
        if path.suffix == ".parquet":
            parts = _parquet_texts(path, text_field)
        elif path.suffix == ".arrow":
            parts = _arrow_texts(path, text_field)
        elif path.suffix == ".jsonl":
            parts = _jsonl_texts(path, _utf8(path), text_field)
        else:
            text = _utf8(path)
            parts = [text] if documents == "file" else _PARAGRAPH.split(text)
        docs += [part for part in parts if part and part.strip()]
    return docs


def _utf8(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"data.paths: {path} is not UTF-8 text ({error.reason} at byte {error.start}): remove it or narrow data.suffixes") from None


def _parquet_texts(path: Path, text_field: str) -> list[str]:
    """The `text_field` column of a Parquet file (read with pyarrow, the `parquet` extra)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"data.paths: reading {path} needs pyarrow: pip install 'currytrain[parquet]'") from None
    try:
        schema = pq.read_schema(path)
    except Exception as error:  # pyarrow raises ArrowInvalid/OSError subclasses for unreadable files
        raise ConfigError(f"data.paths: {path} is not a readable Parquet file ({type(error).__name__}: {error}): fix or remove it") from None
    if text_field not in schema.names:
        raise ConfigError(
            f"data.text_field={text_field}: {path} has no column {text_field!r} (it has {schema.names[:8]}): pass data.text_field=<the text column>"
        )
    return _text_column(pq.read_table(path, columns=[text_field]), path, text_field)


def _arrow_texts(path: Path, text_field: str) -> list[str]:
    """The `text_field` column of an Arrow file: what Hugging Face `datasets` writes with save_to_disk and keeps
    in its cache (the IPC stream format; the file format is read too). Read with pyarrow, offline: no
    `datasets` import, no Hub."""
    try:
        import pyarrow as pa
    except ImportError:
        raise ConfigError(f"data.paths: reading {path} needs pyarrow: pip install 'currytrain[parquet]'") from None
    table = None
    for open_reader in (pa.ipc.open_stream, pa.ipc.open_file):
        try:
            with pa.memory_map(str(path)) as source:
                table = open_reader(source).read_all()
            break
        except (pa.ArrowInvalid, OSError) as error:
            problem = error
    if table is None:
        raise ConfigError(f"data.paths: {path} is not a readable Arrow file ({type(problem).__name__}: {problem}): fix or remove it")
    return _text_column(table, path, text_field)


def _text_column(table: Any, path: Path, text_field: str) -> list[str]:
    """The string column `text_field` of a pyarrow Table read from `path`, or a ConfigError naming both."""
    if text_field not in table.column_names:
        raise ConfigError(
            f"data.text_field={text_field}: {path} has no column {text_field!r} (it has {table.column_names[:8]}): pass data.text_field=<the text column>"
        )
    column = table.column(text_field)
    if str(column.type) not in ("string", "large_string"):
        raise ConfigError(f"data.text_field={text_field}: the column of {path} holds {column.type}, not text: pass data.text_field=<the text column>")
    return column.to_pylist()


def _jsonl_texts(path: Path, text: str, text_field: str) -> list[str]:
    """The `text_field` string of every record of a JSON-lines file, or a ConfigError naming the line."""
    texts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise ConfigError(f"data.paths: {path} line {number} is not JSON ({error.msg}): fix the file or remove it from data.paths") from None
        value = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(value, str):
            keys = sorted(record)[:8] if isinstance(record, dict) else type(record).__name__
            raise ConfigError(
                f"data.text_field={text_field}: {path} line {number} has no string field {text_field!r} (it has {keys}): pass data.text_field=<the field holding the text>"
            )
        texts.append(value)
    return texts


def cache_key(tokenizer_path: Path, eos: int | None, documents: str, files: list[Path], text_field: str = "text") -> str:
    """Hash of everything the token ids depend on; the files' bytes, not their times, so a touch keeps it."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(tokenizer_path.read_bytes())
    digest.update(f"|eos={eos}|documents={documents}|text_field={text_field}|".encode())
    for path in sorted(files):
        digest.update(f"{path.name}:".encode())
        digest.update(hashlib.blake2b(path.read_bytes(), digest_size=16).digest())
    return digest.hexdigest()


class _atomic_folder:
    """A temporary sibling folder renamed to `final` on success; if another process got there first, its copy wins."""

    def __init__(self, final: Path):
        self.final = final

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.stage = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.", dir=self.final.parent))
        return self.stage

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is None:
            try:
                os.rename(self.stage, self.final)
                return
            except OSError:  # a concurrent worker renamed its identical copy first
                pass
        shutil.rmtree(self.stage, ignore_errors=True)


def _encode(tokenizer: Any, docs: list[str], eos: int | None, dtype: np.dtype, out: Path) -> np.ndarray:
    """Write every document's ids (+ EOS) to `out`; returns the (num_docs, 2) offsets. Shows a progress bar."""
    from rich.progress import Progress

    offsets, position = np.zeros((len(docs), 2), dtype=np.int64), 0
    with out.open("wb") as sink, Progress(transient=True) as progress:
        task = progress.add_task("tokenizing", total=len(docs))
        for first in range(0, len(docs), ENCODE_CHUNK):
            chunk = docs[first : first + ENCODE_CHUNK]
            for i, encoding in enumerate(tokenizer.encode_batch(chunk, add_special_tokens=False), start=first):
                ids = encoding.ids + ([eos] if eos is not None else [])
                np.asarray(ids, dtype=dtype).tofile(sink)
                offsets[i] = (position, position + len(ids))
                position += len(ids)
            progress.advance(task, len(chunk))
    return offsets


def build_cache(folder: Path, tokenizer: Any, tokenizer_path: Path, files: list[Path], documents: str, eos: int | None, text_field: str = "text") -> bool:
    """Tokenize into `folder` unless it is there already; True when it was built now."""
    if (folder / "meta.json").is_file():
        return False
    docs = read_documents(files, documents, text_field)
    if not docs:
        raise ConfigError("data.paths hold no text (every file or record is empty): pass files with text")
    vocab = vocab_size_of(tokenizer)
    dtype = dtype_for(vocab)
    with _atomic_folder(folder) as stage:
        offsets = _encode(tokenizer, docs, eos, dtype, stage / "tokens.bin")
        np.save(stage / "docs.npy", offsets)
        meta = {
            "tokenizer": str(tokenizer_path.resolve()),
            "vocab_size": vocab,
            "dtype": dtype.name,
            "eos_id": eos,
            "documents": documents,
            "num_docs": len(docs),
            "num_tokens": int(offsets[-1, 1]) if len(docs) else 0,
            "files": [str(p.resolve()) for p in sorted(files)],
        }
        (stage / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    log.info("token cache built: %s (%d documents, %d tokens)", folder, meta["num_docs"], meta["num_tokens"])
    return True


CACHE_DTYPES = ("uint16", "uint32")


def cache_problem(folder: Path, vocab: int) -> str | None:
    """Why a token cache folder (or one of its splits) does not hold what its meta.json says, or None. Sizes and
    shapes only (no pass over the tokens): a file cut short, replaced or edited since the build, a meta.json that
    is not the one curryTrain wrote, a split that is not a cut of tokens.bin."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as error:
        return f"meta.json cannot be read ({type(error).__name__})"
    counts = [meta.get(key) if isinstance(meta, dict) else None for key in ("num_docs", "num_tokens", "vocab_size")]
    if not isinstance(meta, dict) or meta.get("dtype") not in CACHE_DTYPES or not all(type(n) is int and n >= 0 for n in counts):
        return "meta.json is not the one curryTrain writes (dtype, num_docs, num_tokens, vocab_size)"
    num_docs, num_tokens, cached_vocab = counts
    if cached_vocab != vocab:
        return f"it was built for a vocabulary of {cached_vocab} tokens, the tokenizer has {vocab}"
    size = num_tokens * np.dtype(meta["dtype"]).itemsize
    if not (folder / "tokens.bin").is_file() or (folder / "tokens.bin").stat().st_size != size:
        return f"tokens.bin is not {size} bytes ({num_tokens} {meta['dtype']} ids)"
    try:
        offsets = np.load(folder / "docs.npy", allow_pickle=False)
    except (OSError, ValueError) as error:
        return f"docs.npy cannot be read ({' '.join(str(error).split())[:120]})"
    if offsets.shape != (num_docs, 2) or offsets.dtype.kind not in "iu":
        return f"docs.npy is not ({num_docs}, 2) integer offsets"
    if len(offsets) and (offsets.min() < 0 or offsets.max() > num_tokens or bool((offsets[:, 0] > offsets[:, 1]).any())):
        return f"docs.npy holds offsets outside tokens.bin's {num_tokens} ids"
    for split in sorted(folder.glob("split-*")):
        parts = [split / f"{name}.bin" for name in ("train", "val")]
        if (split / "val.bin").is_file() and (not parts[0].is_file() or sum(p.stat().st_size for p in parts) != size):
            return f"{split.name}/train.bin and val.bin together are not tokens.bin's {size} bytes"
    return None


def build_split(folder: Path, seed: int, val_fraction: float) -> Path:
    """The train.bin/val.bin of one document split, cut from tokens.bin (no tokenizing)."""
    split = folder / f"split-{seed}-{val_fraction}"
    if (split / "val.bin").is_file():
        return split
    offsets = np.load(folder / "docs.npy")
    meta = json.loads((folder / "meta.json").read_text())
    if len(offsets) < 2:
        raise ConfigError(f"data.paths yield {len(offsets)} document(s), too few to hold one out for validation: add files or pass data.documents=paragraph")
    tokens = np.memmap(folder / "tokens.bin", dtype=meta["dtype"], mode="r")
    train_docs, val_docs = split_files(list(range(len(offsets))), val_fraction, seed)
    with _atomic_folder(split) as stage:
        for name, docs in (("train", train_docs), ("val", val_docs)):
            with (stage / f"{name}.bin").open("wb") as sink:
                for doc in sorted(docs):  # document order within a split is irrelevant to batching (random windows)
                    tokens[offsets[doc, 0] : offsets[doc, 1]].tofile(sink)
    return split


def _stream(path: Path, dtype: str) -> torch.Tensor:
    # Copy-on-write mapping: the file stays read-only on disk and the OS pages in only the windows drawn.
    array = np.memmap(path, dtype=dtype, mode="c") if path.stat().st_size else np.zeros(0, dtype=dtype)
    # Ids stay below 2**31, so uint32 reads the same as int32 (a view, no copy), which torch indexes.
    return torch.from_numpy(array.view(np.int32) if array.dtype == np.uint32 else array)


class TokenizedText(TokenCorpus):
    """Text files tokenized by a local tokenizer, cached once, batched as random windows (see TokenCorpus)."""

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
    ):
        tokenizer_path, problem = find_tokenizer(tokenizer)
        if problem:
            raise ConfigError(problem)
        files = collect_text_files(paths, suffixes)
        tok = load_tokenizer(tokenizer_path)
        self.vocab_size = vocab_size_of(tok)
        eos = eos_id(tok, tokenizer_path, eos_token)
        self.cache = Path(cache_dir).expanduser() / cache_key(tokenizer_path, eos, documents, files, text_field)
        self.built = build_cache(self.cache, tok, tokenizer_path, files, documents, eos, text_field)
        if not self.built:
            if problem := cache_problem(self.cache, self.vocab_size):
                raise ConfigError(
                    f"the token cache {self.cache} (data.cache_dir) is damaged: {problem}. Delete that folder and "
                    "curryTrain tokenizes data.paths again, or pass another data.cache_dir"
                )
            log.info("token cache reused: %s", self.cache)
        dtype = json.loads((self.cache / "meta.json").read_text())["dtype"]
        split = build_split(self.cache, seed, val_fraction)
        super().__init__(_stream(split / "train.bin", dtype), _stream(split / "val.bin", dtype), seq_len, seed)

    def describe(self) -> dict:
        return {**super().describe(), "token_cache": str(self.cache), "cache": "built" if self.built else "reused"}
