"""Preparing a token cache once: the corpus streamed through worker processes into sharded token files.

Layout under data.cache_dir (docs/data.md):

    <key>/                     a finished cache; key: a hash of the manifest, the tokenizer, EOS and document rule
      meta.json                tokenizer, dtype, counts, the manifest, and the record of every shard
      shard-000000.bin/.idx/.json   the shards (currytrain/data/shards.py)
      split-<seed>-<val_fraction>.npz   the document spans each split reads, cut on first use (no tokenizing)
    .<key>.partial/            a preparation under way: plan.json and the shards finished so far
    .<key>.lock                held by the one process that prepares (currytrain.lock: pid, host, heartbeat)

The manifest is cheap: each file's path, size, modification time and a hash of its first and last EDGE_BYTES,
so a run start never reads the corpus; `currytrain data verify` hashes every byte. A finished cache is trusted
only when its shards' sizes match meta.json; a preparation resumed after a kill keeps the shards whose
checksums hold and redoes the rest. Bad input removes the partial folder: nothing half-written stays.
Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from currytrain import lock
from currytrain.data.readers import Piece, group_units, hash_range, piecewise_safe, plan_pieces
from currytrain.data.shards import encode_unit, shard_name, shard_problem, write_json
from currytrain.data.tokenizer import load_tokenizer, vocab_size_of
from currytrain.errors import ConfigError, RunFailed

log = logging.getLogger(__name__)

FORMAT = 2
"""Version of the cache layout; part of the key, so a new layout never reads an old one."""
EDGE_BYTES = 4 << 10
"""Bytes hashed at each end of every file for the manifest: one file-system block, so a run start reads 8 KiB a
file (a corpus of many small files would otherwise be read whole)."""
META = "meta.json"
PLAN = "plan.json"
POLL_S = 1.0
"""How often a process waiting for another's preparation looks again (seconds)."""
NOTE_EVERY_S = 30.0
"""How often a waiting process says whom it waits for, and a preparation without a terminal its progress."""
LATER_RANK_DELAY_S = 2.0
"""Local ranks after the first wait this long before trying to prepare, so that local rank 0 (whose output the
user sees) normally does it."""


def dtype_for(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type that holds every id."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


@dataclass(frozen=True)
class CorpusSpec:
    """What one cache is prepared from: the files, the tokenizer and the rules that cut and mark documents."""

    files: tuple[Path, ...]
    tokenizer: Path
    eos: int | None
    documents: str
    text_field: str

    def manifest(self) -> list[dict[str, Any]]:
        """Each file's resolved path, size, modification time and edge hash: read from the file system and the
        first and last EDGE_BYTES of each file, never the whole corpus."""
        return [_fingerprint(path) for path in sorted(self.files)]

    def key(self) -> str:
        digest = hashlib.blake2b(digest_size=12)
        digest.update(self.tokenizer.read_bytes())
        rules = {"format": FORMAT, "eos": self.eos, "documents": self.documents, "text_field": self.text_field}
        digest.update(json.dumps([rules, self.manifest()], sort_keys=True).encode())
        return digest.hexdigest()


def _fingerprint(path: Path) -> dict[str, Any]:
    stat = path.stat()
    digest = hashlib.blake2b(digest_size=12)
    with path.open("rb") as handle:
        digest.update(handle.read(EDGE_BYTES))
        if stat.st_size > EDGE_BYTES:
            handle.seek(max(EDGE_BYTES, stat.st_size - EDGE_BYTES))
            digest.update(handle.read(EDGE_BYTES))
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "edges": digest.hexdigest()}


@dataclass(frozen=True)
class PrepareOptions:
    """How a preparation runs (none of it changes the tokens)."""

    workers: int = 0
    """Worker processes; 0: one per core this process may use. With one, the tokenizer's own threads encode."""
    shard_bytes: int = 128 << 20
    """Input bytes per shard: the unit of parallel work and of resume."""
    wait_s: float = 600.0
    """How long to wait for another process's preparation without a new shard before giving up."""
    progress: bool = True
    """A progress bar on a terminal (else a line every NOTE_EVERY_S); False: no progress at all."""
    repair: bool = False
    """Re-check a finished cache's checksums and redo its damaged shards (currytrain data prepare), instead of
    refusing it (a run)."""
    existing: bool = False
    """Only find a finished cache, never prepare one (currytrain data verify)."""


def partial_of(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.partial"


def ensure_cache(spec: CorpusSpec, cache_dir: Path, options: PrepareOptions) -> tuple[Path, bool]:
    """The finished cache of `spec` under `cache_dir`, prepared now by this process if no one has (True), or
    by another that this one waited for. One process prepares; the others wait under its lock."""
    folder = cache_dir / spec.key()
    if (folder / META).is_file() and not options.repair:
        return folder, False
    if options.existing:
        raise ConfigError(
            f"data: the token cache of {len(spec.files)} file(s) ({spec.files[0]}, ...) is not prepared ({folder} is missing; a file whose size or "
            "modification time changed needs a new one): run `currytrain data prepare <the same overrides>`"
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    if int(os.environ.get("LOCAL_RANK", "0")) > 0:
        _wait_for(lambda: (folder / META).is_file(), LATER_RANK_DELAY_S)
    waiter = _Waiter(folder, options.wait_s)
    while True:
        if (folder / META).is_file() and not options.repair:
            return folder, False
        held = lock.try_hold(cache_dir / f".{folder.name}.lock")
        if isinstance(held, lock.RunLock):
            with held:
                if held.took_over:
                    log.warning("took over the preparation of %s: %s", folder, held.took_over["reason"])
                return folder, prepare(spec, folder, options)
        waiter.wait(held)


def _wait_for(done: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not done():
        time.sleep(0.1)


class _Waiter:
    """Waiting for another process's preparation: bounded by wait_s without a new finished shard, naming the holder."""

    def __init__(self, folder: Path, wait_s: float):
        self.folder, self.wait_s = folder, wait_s
        self.shards = -1
        self.moved = self.noted = time.monotonic()
        self.first = True

    def wait(self, holder: lock.Holder | None) -> None:
        who = holder.describe() if holder else "another process"
        now = time.monotonic()
        shards = len(list(partial_of(self.folder).glob("shard-*.json")))
        if shards != self.shards:
            self.shards, self.moved = shards, now
        if now - self.moved > self.wait_s:
            raise ConfigError(
                f"data: the token cache {self.folder} is being prepared by {who}, and no shard has been finished for "
                f"{now - self.moved:.0f} s (data.prepare_wait={self.wait_s:g}): wait for it with a larger data.prepare_wait, or "
                "prepare the corpus before the runs with `currytrain data prepare <the same overrides>`"
            )
        if self.first or now - self.noted >= NOTE_EVERY_S:
            log.info("waiting for the token cache %s: %s prepares it (%d shards done)", self.folder.name, who, max(shards, 0))
            self.noted, self.first = now, False
        time.sleep(POLL_S)


def prepare(spec: CorpusSpec, folder: Path, options: PrepareOptions) -> bool:
    """Prepare (or, with options.repair, re-check and mend) the cache `folder` while holding its lock; True
    when shards were encoded now."""
    partial = partial_of(folder)
    if (folder / META).is_file():
        try:
            meta = json.loads((folder / META).read_text())
            problems = [problem] if (problem := meta_problem(meta)) else cache_problems(folder, meta, deep=True)
        except ValueError as error:  # a meta.json cut or edited: its shards are checked anew
            problems = [f"{folder / META} cannot be read ({error})"]
        if not problems:
            return False
        log.warning("the token cache %s is damaged (%s): redoing its damaged shards", folder, "; ".join(problems[:3]))
        shutil.rmtree(partial, ignore_errors=True)
        os.rename(folder, partial)
    partial.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(spec.tokenizer)
    dtype = dtype_for(vocab_size_of(tokenizer))
    units = _plan(spec, partial, options.shard_bytes)
    records = _finished_shards(partial, units, dtype.itemsize)
    todo = [index for index in range(len(units)) if index not in records]
    if records:
        log.info("resuming the preparation of %s: %d of %d shards kept, %d to do", folder.name, len(records), len(units), len(todo))
    job = {
        "tokenizer": str(spec.tokenizer),
        "eos": spec.eos,
        "dtype": dtype.name,
        "folder": str(partial),
        "text_field": spec.text_field,
        "piecewise": piecewise_safe(tokenizer),
    }
    started = time.monotonic()
    try:
        _encode(units, todo, job, tokenizer, records, options, folder.name)
    except ConfigError:
        shutil.rmtree(partial, ignore_errors=True)  # bad input: the key changes once the files are fixed
        raise
    meta = _meta(spec, tokenizer, dtype, [records[index] for index in range(len(units))])
    meta["prepared_by"] = asdict(lock.me())
    if meta["num_docs"] == 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise ConfigError("data.paths hold no text (every file or record is empty): pass files with text")
    write_json(partial / META, meta)
    os.rename(partial, folder)
    seconds = time.monotonic() - started
    log.info(
        "token cache prepared by this process: %s (%d shards, %s documents, %s tokens; %d shards encoded in %.1f s)",
        folder,
        len(units),
        f"{meta['num_docs']:,}",
        f"{meta['num_tokens']:,}",
        len(todo),
        seconds,
    )
    return bool(todo)


def _plan(spec: CorpusSpec, partial: Path, shard_bytes: int) -> list[list[Piece]]:
    """The units of the preparation: the plan a killed preparation wrote (so its shards stay valid), else a new one."""
    path = partial / PLAN
    if path.is_file():
        try:
            plan = json.loads(path.read_text())
            return [[Piece.from_dict(piece) for piece in unit] for unit in plan["units"]]
        except (ValueError, KeyError, TypeError):
            log.warning("%s cannot be read: planning anew", path)
    units = group_units(plan_pieces(list(spec.files), spec.documents, shard_bytes), shard_bytes)
    for stale in partial.iterdir():  # shards of an unreadable plan mean nothing
        stale.unlink()
    write_json(path, {"units": [[piece.as_dict() for piece in unit] for unit in units]})
    return units


def _finished_shards(partial: Path, units: list[list[Piece]], itemsize: int) -> dict[int, dict[str, Any]]:
    """The shards of `partial` whose record, sizes and checksum hold; every other shard's files are removed."""
    kept = {}
    for index in range(len(units)):
        path = partial / f"{shard_name(index)}.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = None
        if record and record.get("index") == index and not shard_problem(partial, record, itemsize, deep=True):
            kept[index] = record
            continue
        for suffix in (".json", ".bin", ".idx"):
            (partial / f"{shard_name(index)}{suffix}").unlink(missing_ok=True)
    for leftover in partial.glob("*.tmp"):  # a killed writer's
        leftover.unlink(missing_ok=True)
    return kept


def _meta(spec: CorpusSpec, tokenizer: Any, dtype: np.dtype, records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "tokenizer": str(spec.tokenizer.resolve()),
        "vocab_size": vocab_size_of(tokenizer),
        "dtype": dtype.name,
        "eos_id": spec.eos,
        "documents": spec.documents,
        "text_field": spec.text_field,
        "num_docs": sum(record["docs"] for record in records),
        "num_tokens": sum(record["tokens"] for record in records),
        "files": [str(path.resolve()) for path in sorted(spec.files)],
        "manifest": spec.manifest(),
        "shards": records,
    }


CACHE_DTYPES = ("uint16", "uint32")


def meta_problem(meta: Any) -> str | None:
    """Why a cache's meta.json is not one curryTrain writes (its counts, dtype and shard records), or None."""

    def count(value: Any) -> bool:
        return type(value) is int and value >= 0

    shards = meta.get("shards") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or meta.get("dtype") not in CACHE_DTYPES or not all(count(meta.get(key)) for key in ("num_docs", "num_tokens", "vocab_size")):
        return f"{META} is not the one curryTrain writes (dtype, num_docs, num_tokens, vocab_size)"
    if not (isinstance(meta.get("eos_id"), int) or meta.get("eos_id") is None) or not isinstance(shards, list):
        return f"{META} is not the one curryTrain writes (eos_id, shards)"
    if not all(isinstance(record, dict) and all(count(record.get(key)) for key in ("index", "tokens", "docs")) for record in shards):
        return f"{META} holds a shard record without its index, tokens and docs counts"
    if (
        len({record["index"] for record in shards}) != len(shards)
        or sum(r["tokens"] for r in shards) != meta["num_tokens"]
        or sum(r["docs"] for r in shards) != meta["num_docs"]
    ):
        return f"{META}'s shard records do not add up to its num_tokens and num_docs"
    return None


def cache_problems(folder: Path, meta: dict[str, Any], deep: bool = False) -> list[str]:
    """Why the finished cache `folder` cannot be trusted: shards missing or cut (sizes, from the file system
    alone), or with deep, ids that no longer match their checksums."""
    itemsize = np.dtype(meta["dtype"]).itemsize
    return [problem for record in meta["shards"] if (problem := shard_problem(folder, record, itemsize, deep))]


def input_problems(meta: dict[str, Any]) -> list[str]:
    """Input files whose bytes differ from those the cache was prepared from (every byte is hashed)."""
    problems = []
    for record in meta["shards"]:
        for piece in record["inputs"]:
            path = piece["path"]
            if not Path(path).is_file():
                problems.append(f"{path} is gone")
            elif hash_range(path, piece["start"], piece["end"]) != piece["hash"]:
                problems.append(f"{path} bytes {piece['start']}-{piece['end']} changed since the cache was prepared")
    return list(dict.fromkeys(problems))


# ---------------------------------------------------------------------------------------------- encoding


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _encode(
    units: list[list[Piece]], todo: list[int], job: dict[str, Any], tokenizer: Any, records: dict[int, dict], options: PrepareOptions, name: str
) -> None:
    """Encode the units `todo` into shards, in worker processes (or in this one, when one worker is enough)."""
    total = sum(piece.size for unit in units for piece in unit)
    done = sum(piece.size for index in records for piece in units[index])
    display = Display(name, total, done, options.progress)
    workers = min(options.workers or available_cores(), len(todo))
    with display:
        if workers <= 1:
            for index in todo:
                partial = Path(job["folder"])
                records[index] = encode_unit(
                    index, units[index], tokenizer, job["eos"], np.dtype(job["dtype"]), partial, job["text_field"], job["piecewise"], display.advance
                )
        elif todo:
            WorkerPool(workers, job).run({index: units[index] for index in todo}, display.advance, records)


class WorkerPool:
    """Worker processes (`python -m currytrain.data.shards`) fed units one at a time over their stdin."""

    def __init__(self, count: int, job: dict[str, Any]):
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        env["OMP_NUM_THREADS"] = "1"
        self.messages: queue.Queue = queue.Queue()
        self.procs = []
        for number in range(count):
            proc = subprocess.Popen(
                [sys.executable, "-m", "currytrain.data.shards"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, bufsize=1
            )
            proc.stdin.write(json.dumps(job) + "\n")
            proc.stdin.flush()
            threading.Thread(target=self._listen, args=(number, proc), daemon=True).start()
            self.procs.append(proc)

    def _listen(self, number: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.messages.put((number, json.loads(line)))
        self.messages.put((number, None))

    def run(self, units: dict[int, list[Piece]], advance: Callable[[int, int, int], None], records: dict[int, dict]) -> None:
        waiting = list(units)
        busy: dict[int, int] = {}
        try:
            for number in range(len(self.procs)):
                self._give(number, waiting, units, busy)
            while busy:
                number, message = self.messages.get()
                if message is None:
                    code = self.procs[number].wait()
                    raise RunFailed(
                        f"a tokenizing worker (pid {self.procs[number].pid}) ended with exit code {code} while encoding shard {busy.get(number)}: "
                        "run the same command again; the finished shards are kept"
                    )
                if "progress" in message:
                    advance(*message["progress"])
                elif "error" in message:
                    raise ConfigError(message["error"])
                else:
                    records[message["done"]] = message["record"]
                    del busy[number]
                    self._give(number, waiting, units, busy)
        finally:
            self.close(stop=bool(busy))

    def _give(self, number: int, waiting: list[int], units: dict[int, list[Piece]], busy: dict[int, int]) -> None:
        if not waiting:
            return
        index = waiting.pop(0)
        busy[number] = index
        self.procs[number].stdin.write(json.dumps({"index": index, "pieces": [piece.as_dict() for piece in units[index]]}) + "\n")
        self.procs[number].stdin.flush()

    def close(self, stop: bool) -> None:
        """Close every worker's stdin (an idle one exits); with stop, kill those still encoding (the run failed)."""
        for proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
            if stop and proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Display:
    """Progress of a preparation: bytes, documents and tokens per second and an ETA; a rich bar on a terminal,
    else a log line every NOTE_EVERY_S seconds."""

    def __init__(self, name: str, total: int, done: int, enabled: bool):
        self.name, self.total, self.done = name, total, done
        self.start_done = done
        self.docs = self.tokens = 0
        self.started = self.noted = time.monotonic()
        self.bar = None
        if not enabled:
            self.noted = float("inf")
            return
        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal:
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("tokenizing"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[rates]}"), TimeRemainingColumn(), console=console
            )
            self.task = self.bar.add_task("prepare", total=total, completed=done, rates="")

    def __enter__(self) -> Display:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def rates(self) -> tuple[float, float, float, float]:
        """(MB/s, documents/s, tokens/s, seconds left) over this preparation so far."""
        seconds = max(time.monotonic() - self.started, 1e-6)
        per_s = (self.done - self.start_done) / seconds
        left = (self.total - self.done) / per_s if per_s > 0 else float("inf")
        return per_s / 1e6, self.docs / seconds, self.tokens / seconds, left

    def advance(self, num_bytes: int, docs: int, tokens: int) -> None:
        self.done, self.docs, self.tokens = self.done + num_bytes, self.docs + docs, self.tokens + tokens
        mb_s, docs_s, tokens_s, left = self.rates()
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, rates=f"{mb_s:.1f} MB/s {docs_s:,.0f} docs/s {tokens_s / 1e6:.2f}M tok/s")
        elif time.monotonic() - self.noted >= NOTE_EVERY_S:
            self.noted = time.monotonic()
            log.info(
                "tokenizing %s: %.2f of %.2f GB (%.0f%%), %.1f MB/s, %.0f docs/s, %.2fM tokens/s, ETA %s",
                self.name,
                self.done / 1e9,
                self.total / 1e9,
                100 * self.done / max(self.total, 1),
                mb_s,
                docs_s,
                tokens_s / 1e6,
                _duration(left),
            )


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "unknown"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


# ------------------------------------------------------------------------------------------------ splits


def split_spans(folder: Path, meta: dict[str, Any], seed: int, val_fraction: float) -> dict[str, np.ndarray]:
    """The documents of each split as spans (shard, first token, end token) of runs of consecutive documents.
    Documents are held out by a seeded draw of max(1, round(num_docs x val_fraction)) of them, so each lands
    wholly in one split. Cut once per (seed, val_fraction) and kept in the cache."""
    path = folder / f"split-{seed}-{val_fraction}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as saved:
                spans = {name: saved[name] for name in ("train", "val")}
            if _spans_fit(spans, meta):
                return spans
        except (OSError, ValueError, KeyError):
            pass
        log.warning("%s does not match the cache: cutting it again", path)
    shard, first, end = _documents(folder, meta)
    if len(end) < 2:
        raise ConfigError(f"data.paths yield {len(end)} document(s), too few to hold one out for validation: add files or pass data.documents=paragraph")
    held_out = np.zeros(len(end), dtype=bool)
    held_out[np.random.default_rng(seed).choice(len(end), size=max(1, round(len(end) * val_fraction)), replace=False)] = True
    spans = {"train": _runs(np.flatnonzero(~held_out), shard, first, end), "val": _runs(np.flatnonzero(held_out), shard, first, end)}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **spans)
    os.replace(tmp, path)
    return spans


def _spans_fit(spans: dict[str, np.ndarray], meta: dict[str, Any]) -> bool:
    """Whether saved split spans are (k, 3) integer runs within the cache's shards that cover its tokens."""
    tokens = {record["index"]: record["tokens"] for record in meta["shards"]}
    for span in spans.values():
        if span.ndim != 2 or span.shape[1] != 3 or span.dtype.kind not in "iu":
            return False
        known = np.isin(span[:, 0], list(tokens))
        limits = np.array([tokens.get(int(index), -1) for index in span[:, 0]], dtype=np.int64)
        if not known.all() or (span[:, 1] < 0).any() or (span[:, 1] > span[:, 2]).any() or (span[:, 2] > limits).any():
            return False
    return sum(int((span[:, 2] - span[:, 1]).sum()) for span in spans.values()) == meta["num_tokens"]


def _documents(folder: Path, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shard, first token, end token) of every document of the cache, in order."""
    shards, firsts, ends = [], [], []
    for record in meta["shards"]:
        doc_ends = np.load(folder / f"{shard_name(record['index'])}.idx", allow_pickle=False)
        shards.append(np.full(len(doc_ends), record["index"], dtype=np.int64))
        firsts.append(np.concatenate([[0], doc_ends[:-1]]).astype(np.int64) if len(doc_ends) else np.zeros(0, dtype=np.int64))
        ends.append(doc_ends.astype(np.int64))
    return np.concatenate(shards), np.concatenate(firsts), np.concatenate(ends)


def _runs(docs: np.ndarray, shard: np.ndarray, first: np.ndarray, end: np.ndarray) -> np.ndarray:
    """(k, 3) spans covering the documents `docs` (sorted), one per run of consecutive documents of one shard."""
    if not len(docs):
        return np.zeros((0, 3), dtype=np.int64)
    breaks = np.flatnonzero((np.diff(docs) != 1) | (np.diff(shard[docs]) != 0)) + 1
    starts = docs[np.concatenate([[0], breaks])]
    stops = docs[np.concatenate([breaks - 1, [len(docs) - 1]])]
    return np.stack([shard[starts], first[starts], end[stops]], axis=1)
