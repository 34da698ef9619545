"""Typed configs of the data group (conf/data/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from currytrain.rules import bounded, one_of


@dataclass
class ByteCorpusConfig:
    """Fields of every byte-level corpus (vocab 256, split into train/val by file)."""

    _target_: str = "???"
    seq_len: int = bounded("${model.max_seq_len}", ge=1, example=128)
    """Tokens per training sequence (bytes)."""
    val_fraction: float = bounded(0.1, gt=0, lt=1)
    """Share of the files (not bytes) held out for validation, chosen before any processing;
    a single file is split at that byte offset instead."""
    max_bytes: int = bounded(0, ge=0)
    """Cap on the bytes read (train and val share it in proportion); 0 reads everything."""
    seed: int = bounded("${seed}", ge=0, lt=2**63, example=0)
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

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        """The paths hold readable text, and enough of it for one sequence in each split (sized, not read)."""
        from currytrain.data.files import find_text_files, not_text, plan_split, planned_sizes

        files, problems = find_text_files(node.paths, node.suffixes)
        problems += [f"{path}.paths: {problem}" for file in files if (problem := not_text(file))]
        if files and not problems and 0 < node.val_fraction < 1 and node.max_bytes >= 0:
            train, val = planned_sizes(plan_split(files, node.val_fraction, node.max_bytes, node.seed))
            if min(train, val) <= node.seq_len + 1:
                problems.append(
                    f"{path}.paths hold {train} train / {val} val bytes, too few for {path}.seq_len={node.seq_len} "
                    f"(each split needs more than one sequence): add text, lower {path}.seq_len or change {path}.val_fraction"
                )
        return problems


@dataclass
class SyntheticConfig:
    """Uniform random tokens: no signal to learn, for throughput benchmarks."""

    _target_: str = "currytrain.data.corpus.SyntheticTokens"
    vocab_size: int = bounded(256, ge=1)
    """Token ids are drawn uniformly from [0, vocab_size)."""
    seq_len: int = bounded("${model.max_seq_len}", ge=1, example=128)
    """Tokens per training sequence."""
    num_tokens: int = bounded(1_000_000, ge=1)
    """Length of the generated token stream (train); val gets a tenth of it."""
    seed: int = bounded("${seed}", ge=0, lt=2**63, example=0)
    """Seed of the generated stream and of batch sampling."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = []
        if node.num_tokens <= node.seq_len + 1:
            problems.append(f"{path}.num_tokens={node.num_tokens} must exceed {path}.seq_len + 1 = {node.seq_len + 1}: pass {path}.num_tokens=1000000")
        return problems


@dataclass
class SourceConfig:
    """One corpus of a mixture (data.sources.<name>)."""

    path: str = "???"
    """A file or folder of text, .jsonl, .parquet or .arrow files (folders are searched for data.suffixes)."""
    weight: float = bounded(1.0, gt=0)
    """Its share of the windows: weight over the sum of the sources' weights."""
    text_field: str = ""
    """The field or column holding its text; empty: data.text_field."""


@dataclass
class TokensConfig:
    """Text files tokenized by a local tokenizer into a sharded token cache, prepared once (docs/data.md)."""

    _target_: str = "currytrain.data.tokens.TokenizedText"
    tokenizer: str = "???"
    """A tokenizer.json, a folder holding one (a Hugging Face model folder) or a `currytrain hf import` folder."""
    paths: list[str] = field(default_factory=list)
    """Files or folders of UTF-8 text; folders are searched recursively for `suffixes`. Empty with `sources`."""
    sources: dict[str, SourceConfig] = field(default_factory=dict)
    """Several corpora mixed by weight, by name (data.sources.web.weight=0.8), instead of `paths`; a mixture can be
    a file of the data/sources group (data/sources=<name>). Each is prepared into its own cache."""
    suffixes: list[str] = field(default_factory=lambda: [".txt", ".md", ".jsonl", ".parquet", ".arrow"])
    """File endings read from folders (files named directly are always read). A .jsonl file holds one
    document per line, a JSON object whose `text_field` is the text; a .parquet or .arrow file one per row
    (.arrow: a Hugging Face `datasets` save_to_disk folder or cache, read offline with pyarrow)."""
    text_field: str = "text"
    """The field of each .jsonl record, or the column of each .parquet/.arrow file, that holds the text."""
    documents: str = "file"
    """What one document is: file (each file) or paragraph (blank-line-separated blocks). Documents are
    split between train and val before tokenization; none contributes to both."""
    eos_token: str = "auto"
    """Token appended after every document: auto (the eos_token of tokenizer_config.json beside
    tokenizer.json, nothing if there is none), none, or a token string of the vocabulary."""
    cache_dir: str = "runs/token_cache"
    """Folder of the token caches, one subfolder per (tokenizer, files, documents, EOS) hash; reused across runs."""
    seq_len: int = bounded("${model.max_seq_len}", ge=1, example=128)
    """Tokens per training sequence."""
    val_fraction: float = bounded(0.1, gt=0, lt=1)
    """Share of the documents held out for validation (at least one)."""
    seed: int = bounded("${seed}", ge=0, lt=2**63, example=0)
    """Seed of the document split and of batch sampling."""
    workers: int = bounded(0, ge=0)
    """Processes that tokenize a corpus being prepared; 0: one per CPU core this process may use."""
    shard_mb: int = bounded(128, ge=1)
    """Input megabytes (MiB) per shard of the cache: the unit of parallel work and of resume after a kill."""
    prepare_wait: float = bounded(600.0, gt=0)
    """Seconds a process waits for another one preparing the same cache without a shard being finished, before
    it gives up naming that process."""
    restart_positions: bool = False
    """Document-aware packing: positions restart at 0 after each EOS, so every document starts at position 0
    (the model must offer it: model=gqa, model=moe). False: positions run across the window, documents and all."""
    mask_documents: bool = False
    """Document-aware packing: attention does not cross an EOS; each token attends to the earlier tokens of its
    own document only. Usually with restart_positions=true."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        """The tokenizer and the text files exist (read, not tokenized), the split and document rule are valid."""
        from currytrain.data.files import find_text_files
        from currytrain.data.tokenizer import find_tokenizer

        problems = []
        if node.documents not in ("file", "paragraph"):
            problems.append(f"{path}.documents={node.documents} is not one of ['file', 'paragraph']: pass {path}.documents=file")
        _, problem = find_tokenizer(node.tokenizer)
        problems += [problem] if problem else []
        if node.sources and node.paths:
            problems.append(f"{path}.paths and {path}.sources are both set: pass the corpus as one source more, or {path}.paths=[] ")
        if not node.sources:
            return problems + find_text_files(node.paths, node.suffixes)[1]
        for name, source in node.sources.items():
            found = find_text_files([source.path], node.suffixes)[1]
            problems += [f"{path}.sources.{name}.path: {problem.split(': ', 1)[1]}" for problem in found]
        return problems


@dataclass
class ProbeConfig:
    """Synthetic probe tasks that need one mechanism each (copy, recall, induction, parity, selective_copy)."""

    _target_: str = "currytrain.data.probe.ProbeTasks"
    task: str = "induction"
    """copy, recall (associative), induction, parity or selective_copy (currytrain/data/probe.py shows each layout)."""
    seq_len: int = bounded("${model.max_seq_len}", ge=8, example=32)
    """Tokens per sequence (shorter task layouts are left-padded with the noise token)."""
    num_symbols: int = bounded(16, ge=2)
    """Alphabet of the task's content (token ids 3 .. 3 + num_symbols - 1; 0-2 are separator, query, noise)."""
    seed: int = bounded("${seed}", ge=0, lt=2**63, example=0)
    """Seed of every generated sequence."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        from currytrain.data.probe import TASKS

        return one_of(node, path, "task", TASKS, "induction")


@dataclass
class TabularConfig:
    """Fields of every table of features and class labels (the leakage-safe pipeline, docs/data.md)."""

    _target_: str = "???"
    val_fraction: float = bounded(0.2, gt=0, lt=1)
    """Share of the rows (of the groups with split=grouped, of the distinct timestamps with split=temporal)
    held out for validation, chosen before any preprocessing."""
    test_fraction: float = bounded(0.0, ge=0, lt=1)
    """Share held out for a test split the training never reads; 0 keeps none."""
    normalize: bool = True
    """Standardise each feature (scikit-learn's StandardScaler) with statistics of the train rows only."""
    seed: int = bounded("${seed}", ge=0, lt=2**63, example=0)
    """Seed of the split and of batch sampling."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        if not node.val_fraction + node.test_fraction < 1:
            return [
                f"{path}.test_fraction={node.test_fraction} with {path}.val_fraction={node.val_fraction} leaves no rows for train: pass {path}.test_fraction=0"
            ]
        return []


@dataclass
class DigitsConfig(TabularConfig):
    """scikit-learn's bundled handwritten digits: 1797 rows of 64 pixel features, 10 classes (no download)."""

    _target_: str = "currytrain.data.tabular.Digits"


SPLIT_KINDS = ("random", "grouped", "temporal")
"""How table rows are assigned to splits (data.split); currytrain.data.pipeline implements each."""


@dataclass
class TableConfig(TabularConfig):
    """A table of the user's (.csv, .parquet or .jsonl): numeric features and an integer class column."""

    _target_: str = "currytrain.data.tabular.TableFile"
    path: str = "???"
    """The table file: .csv, .parquet or .jsonl (read with pyarrow, the parquet extra)."""
    target: str = "label"
    """Column of class ids 0..C-1."""
    features: list[str] = field(default_factory=list)
    """Numeric feature columns; empty takes every column but target, group_column and time_column."""
    split: str = "random"
    """random (seeded rows), grouped (whole groups of group_column per split: no group in two splits) or
    temporal (earliest time_column values train, later ones val, latest test: no train row is later than a val row)."""
    group_column: str = ""
    """With split=grouped: the column naming each row's group (a patient, a user, a session)."""
    time_column: str = ""
    """With split=temporal: the column of each row's timestamp (any sortable type)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        """The file exists with a known ending and its header holds every column named; the split names the
        column it needs. Column types are checked when the table is read."""
        from pathlib import Path

        from currytrain.data.files import table_columns

        problems = one_of(node, path, "split", SPLIT_KINDS)
        for kind, key in (("grouped", "group_column"), ("temporal", "time_column")):
            if node.split == kind and not node[key]:
                problems.append(f"{path}.split={kind} needs {path}.{key}: pass {path}.{key}=<the column>")
        file = Path(str(node.path)).expanduser()
        if not file.is_file():
            return problems + [f"{path}.path={node.path} is not a file: pass {path}.path=<a .csv, .parquet or .jsonl table>"]
        if file.suffix not in (".csv", ".parquet", ".jsonl"):
            return problems + [f"{path}.path={node.path} is not a .csv, .parquet or .jsonl file: convert it, or pass one of those"]
        columns, problem = table_columns(file)
        if problem:
            return problems + [problem]
        named = [("target", node.target), ("group_column", node.group_column), ("time_column", node.time_column)]
        named += [("features", name) for name in node.features]
        for key, name in named:
            if name and name not in columns:
                problems.append(f"{path}.{key}: {node.path} has no column {name!r} (it has {columns[:12]}): pass {path}.{key}=<a column>")
        return problems
