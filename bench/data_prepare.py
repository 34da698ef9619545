"""Preparing a corpus at scale (`currytrain data prepare`, currytrain/data/prepare.py), against the tokenizers
library's own encode_batch over the same files, in one script.

    nice -n 10 .venv/bin/python bench/data_prepare.py                      # 1 GB and 5 GB corpora
    .venv/bin/python bench/data_prepare.py --sizes 0.05 --startup-repeats 1    # a smoke run

For each size it generates a JSON-lines corpus of English-like documents (files of FILE_MB each), trains (once) a
byte-level BPE tokenizer of 8,192 ids on a sample, and measures:

- the preparation: `python -m currytrain.cli data prepare data=tokens ...` in its own process, its wall time and
  CPU time (its workers' included), MB/s and tokens/s, and the peak resident memory of its whole process tree (the preparing process and its
  tokenizing workers, sampled every 0.5 s from /proc) and of its largest process;
- the baseline: one process reading the same files line by line and encoding batches of documents with
  `Tokenizer.encode_batch` on all cores (TOKENIZERS_PARALLELISM=true), counting the ids, writing nothing;
- on the smallest size, the preparation in one process (data.workers=1: encode_batch's own threads) beside the
  worker processes (data.workers=0: one per core), which is how the default was chosen;
- on the largest size, the added start-up of a run on its prepared cache: `python launch.py` for one step on
  the default corpus (data=bytes) and on the cache (data=tokens), the same model (8,192 ids), taking turns,
  medians of wall times; and, in one process, the part the data option changes: validating the config and
  building the data adapter.

Ratios are what count: every figure of one row comes from the same machine in the same minutes. The corpora and
caches are deleted at the end unless --keep. Results are printed and, with --out, written as markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILE_MB = 512
"""Size of each generated corpus file (a corpus of 5 GB is ten of them)."""
VOCAB = 8192
TINY_RUN = [
    "model.dim=64",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.mlp_hidden=128",
    "model.max_seq_len=128",
    "trainer.batch_size=4",
    "trainer.max_steps=1",
    "trainer.eval_every=1",
    "trainer.eval_batches=1",
    "trainer.progress=false",
    "optimizer.schedule.warmup_steps=0",
    "logger=[jsonl]",
]

BASELINE = r"""
import json, os, sys, time
os.environ["TOKENIZERS_PARALLELISM"] = "true"
from tokenizers import Tokenizer
tokenizer = Tokenizer.from_file(sys.argv[1])
started, tokens, size, batch = time.perf_counter(), 0, 0, []
def flush():
    global tokens, batch
    tokens += sum(len(encoding.ids) for encoding in tokenizer.encode_batch(batch, add_special_tokens=False))
    batch = []
for path in sys.argv[2:]:
    size += os.path.getsize(path)
    with open(path, "rb") as lines:
        for line in lines:
            batch.append(json.loads(line)["text"])
            if len(batch) == 512:
                flush()
flush()
print(json.dumps({"seconds": time.perf_counter() - started, "tokens": tokens, "bytes": size}))
"""


def words() -> list[str]:
    """English-like words: those of the standard library's comments and docstrings, most common first."""
    counts: dict[str, int] = {}
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:300]:
        for word in re.findall(r"\b[a-z]{2,14}\b", path.read_text(encoding="utf-8", errors="replace")):
            counts[word] = counts.get(word, 0) + 1
    return sorted(counts, key=counts.get, reverse=True)[:8000]


def document_pool(rng: random.Random, count: int) -> list[str]:
    """`count` documents of 100-2,000 words drawn by a Zipf-like law, in sentences and paragraphs."""
    vocabulary = words()
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    pool = []
    for _ in range(count):
        chosen = rng.choices(vocabulary, weights, k=rng.randrange(100, 2000))
        sentences = [" ".join(chosen[i : i + 14]).capitalize() + "." for i in range(0, len(chosen), 14)]
        pool.append("\n\n".join(" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5)))
    return pool


def generate(folder: Path, size_gb: float, pool: list[str], rng: random.Random) -> list[Path]:
    """A JSON-lines corpus of about size_gb GB: the pool's documents in a shuffled order, each with its own number."""
    folder.mkdir(parents=True, exist_ok=True)
    target, written, number, files = int(size_gb * 1e9), 0, 0, []
    while written < target:
        path = folder / f"part-{len(files):05d}.jsonl"
        with path.open("w") as sink:
            held = 0
            while held < FILE_MB << 20 and written + held < target:
                line = json.dumps({"id": number, "text": f"Document {number}. " + pool[rng.randrange(len(pool))]}) + "\n"
                sink.write(line)
                held += len(line)
                number += 1
        written += held
        files.append(path)
    return files


def train_tokenizer(folder: Path, pool: list[str]) -> Path:
    path = folder / "tokenizer.json"
    if path.is_file():
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(pool[:500], trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    return path


def tree_rss(pid: int) -> tuple[int, int]:
    """(total, largest) resident bytes of `pid` and its descendants, read from /proc (Linux)."""
    tree, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                children = [int(child) for child in task.read_text().split()]
            except OSError:
                continue
            tree += children
            frontier += children
    sizes = []
    for member in tree:
        try:
            status = Path(f"/proc/{member}/status").read_text()
            sizes.append(int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024)
        except (OSError, AttributeError):
            pass
    return sum(sizes), max(sizes, default=0)


def watched(args: list[str], env: dict[str, str] | None = None) -> dict:
    """Run `args`; its wall seconds, peak tree and process RSS, and its output (through files: a pipe left
    unread could fill and stall it)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=out, stderr=err, text=True)
        peak_tree = peak_one = 0
        while proc.poll() is None:
            total, largest = tree_rss(proc.pid)
            peak_tree, peak_one = max(peak_tree, total), max(peak_one, largest)
            time.sleep(0.5)
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # every descendant waited for: the workers too
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:6])} ... failed ({proc.returncode}):\n{stderr[-3000:]}")
    return {"seconds": seconds, "cpu": cpu, "peak_tree": peak_tree, "peak_process": peak_one, "stdout": stdout, "stderr": stderr}


def prepare(tokenizer: Path, files: list[Path], cache: Path, workers: int, shard_mb: int) -> dict:
    overrides = ["data=tokens", f"data.tokenizer={tokenizer}", f"data.paths=[{files[0].parent}]", f"data.cache_dir={cache}", f"data.workers={workers}"]
    overrides.append(f"data.shard_mb={shard_mb}")
    result = watched([sys.executable, "-m", "currytrain.cli", "data", "prepare", *overrides], {"PYTHONPATH": str(ROOT)})
    [folder] = [path for path in cache.iterdir() if (path / "meta.json").is_file()]
    meta = json.loads((folder / "meta.json").read_text())
    return {**result, "tokens": meta["num_tokens"], "docs": meta["num_docs"], "shards": meta["shards"], "bytes": sum(p.stat().st_size for p in files)}


def baseline(tokenizer: Path, files: list[Path]) -> dict:
    result = watched([sys.executable, "-c", BASELINE, str(tokenizer), *map(str, files)])
    found = json.loads(result["stdout"])
    return {**result, **found, "seconds": found["seconds"]}


DATA_START = r"""
import json, statistics, sys, time
from currytrain.config import compose_config
from currytrain.build import build
from currytrain.validate import validate
runs = {"default corpus": ["trainer.max_steps=1"], "prepared cache": json.loads(sys.argv[1])}
seconds = {name: [] for name in runs}
for repeat in range(int(sys.argv[2]) + 1):  # the first round imports what both need: not counted
    for name, overrides in runs.items():
        cfg = compose_config(overrides)
        started = time.perf_counter()
        assert validate(cfg) == []
        build(cfg.data)
        if repeat:
            seconds[name].append(time.perf_counter() - started)
print(json.dumps({name: statistics.median(values) for name, values in seconds.items()}))
"""


def startup(tokenizer: Path, corpus: Path, cache: Path, repeats: int, folder: Path) -> dict[str, dict[str, float]]:
    """Medians of what a run's start costs on the default corpus and on the prepared cache, taking turns: the wall
    seconds of a whole one-step run (`python launch.py`), and, in one process, of validating the config and
    building the data (what the data option changes; the rest of a start is the same for both)."""
    runs = {
        "default corpus": [f"model.vocab_size={VOCAB}"],  # the same model: only the data differs
        "prepared cache": ["data=tokens", f"data.tokenizer={tokenizer}", f"data.paths=[{corpus}]", f"data.cache_dir={cache}", f"model.vocab_size={VOCAB}"],
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for repeat in range(repeats):
        for name, overrides in runs.items():
            run_dir = folder / f"run-{name.split()[0]}-{repeat}"
            result = watched([sys.executable, str(ROOT / "launch.py"), *TINY_RUN, *overrides, f"hydra.run.dir={run_dir}"])
            if name == "prepared cache" and "token cache reused" not in result["stdout"] + result["stderr"]:
                raise SystemExit(f"the run on the cache did not reuse it:\n{result['stdout'][-2000:]}{result['stderr'][-2000:]}")
            seconds[name].append(result["seconds"])
    whole = {name: statistics.median(values) for name, values in seconds.items()}
    data = watched([sys.executable, "-c", DATA_START, json.dumps(runs["prepared cache"]), str(max(repeats, 5))], {"PYTHONPATH": str(ROOT)})
    return {"whole run": whole, "validate + build data": json.loads(data["stdout"].strip().splitlines()[-1])}


def row(name: str, result: dict) -> str:
    mb_s, tokens_s = result["bytes"] / 1e6 / result["seconds"], result["tokens"] / result["seconds"]
    return (
        f"| {name} | {result['bytes'] / 1e9:.2f} | {result['seconds']:.0f} | {result['cpu']:.0f} | {mb_s:.2f} | {tokens_s / 1e6:.3f} | "
        f"{result['peak_tree'] / 2**30:.2f} | {result['peak_process'] / 2**30:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,5", help="corpus sizes in GB, comma-separated (default 1,5)")
    parser.add_argument("--baseline-sizes", default=None, help="sizes that also run the encode_batch baseline (default: all)")
    parser.add_argument("--startup-repeats", type=int, default=3, help="one-step runs of each kind for the start-up (default 3)")
    parser.add_argument("--workdir", default=None, help="where corpora and caches go (default: a temporary folder)")
    parser.add_argument(
        "--shard-mb", type=int, default=0, help="data.shard_mb of the preparations; 0: 128 (the default), smaller where a corpus would give < 4 per core"
    )
    parser.add_argument("--keep", action="store_true", help="keep the corpora and caches")
    parser.add_argument("--out", default=None, help="also write the results as markdown to this file")
    args = parser.parse_args()
    sizes = [float(size) for size in args.sizes.split(",")]
    baseline_sizes = sizes if args.baseline_sizes is None else [float(size) for size in args.baseline_sizes.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="currytrain-data-bench-"))
    rng = random.Random(0)
    pool = document_pool(rng, 5_000)
    tokenizer = train_tokenizer(work / "tokenizer", pool)
    lines = [
        f"cores: {len(os.sched_getaffinity(0))}, tokenizer: byte-level BPE of {VOCAB} ids, corpus: JSON lines of English-like documents",
        "",
        "| run | GB | wall s | CPU s | MB/s | M tokens/s | peak RSS, all processes (GiB) | peak RSS, largest process (GiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios, start = [], None
    try:
        for size in sizes:
            corpus = generate(work / f"corpus-{size:g}", size, pool, rng)
            # Enough shards for every worker to have several: a corpus of one shard is encoded in one process.
            shard_mb = args.shard_mb or max(1, min(128, int(size * 1e9 / 2**20) // (4 * len(os.sched_getaffinity(0)))))
            ours = prepare(tokenizer, corpus, work / f"cache-{size:g}", workers=0, shard_mb=shard_mb)
            lines.append(row(f"data prepare, {size:g} GB ({len(ours['shards'])} shards, worker processes)", ours))
            if size == min(sizes):
                alone = prepare(tokenizer, corpus, work / f"cache-{size:g}-one", workers=1, shard_mb=shard_mb)
                lines.append(row(f"data prepare, {size:g} GB (one process, encode_batch threads)", alone))
            if size in baseline_sizes:
                base = baseline(tokenizer, corpus)
                lines.append(row(f"encode_batch baseline, {size:g} GB", base))
                ratios.append((size, base["seconds"] / ours["seconds"], base["cpu"] / ours["cpu"]))
            print("\n".join(lines[-3:]), flush=True)
            if size == max(sizes):
                start = startup(tokenizer, corpus[0].parent, work / f"cache-{size:g}", args.startup_repeats, work)
            if not args.keep:
                subprocess.run(["rm", "-rf", str(corpus[0].parent), str(work / f"cache-{size:g}"), str(work / f"cache-{size:g}-one")], check=True)
    finally:
        if not args.keep:
            subprocess.run(["rm", "-rf", str(work)], check=False)
    lines.append("")
    lines += [
        f"throughput of data prepare / encode_batch baseline, {size:g} GB: {wall:.2f}x by wall time, {cpu:.2f}x by CPU time" for size, wall, cpu in ratios
    ]
    for what, medians in (start or {}).items():
        lines.append(
            f"start-up, {what}: default corpus {medians['default corpus']:.2f} s, prepared {max(sizes):g} GB cache "
            f"{medians['prepared cache']:.2f} s: added {medians['prepared cache'] - medians['default corpus']:+.2f} s (medians)"
        )
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
