"""Corpora: the stdlib bytes, the user's text, synthetic tokens; split by file; deterministic batches."""

from __future__ import annotations

import pytest
import torch

from currytrain.data.corpus import StdlibBytes, SyntheticTokens, TextFiles, stdlib_sources
from currytrain.errors import ConfigError


def test_stdlib_corpus_is_split_by_file_and_deterministic_given_the_seed():
    first = StdlibBytes(seq_len=32, max_bytes=200_000, seed=3)
    again = StdlibBytes(seq_len=32, max_bytes=200_000, seed=3)
    other = StdlibBytes(seq_len=32, max_bytes=200_000, seed=4)
    assert not set(first.train_files) & set(first.val_files)
    assert first.train_files == again.train_files and torch.equal(first.train, again.train)
    assert first.val_files != other.val_files
    assert len(first.train) + len(first.val) == 200_000
    assert abs(len(first.val) / 200_000 - 0.1) < 0.01
    assert first.train_files[0].suffix == ".py" and "site-packages" not in first.train_files[0].parts


def test_stdlib_sources_are_every_py_file_outside_site_packages(tmp_path):
    for name in ("os.py", "json/decoder.py", "json/data.txt", "site-packages/numpy/core.py", "a/site-packages/b.py", "a/b/c.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    (tmp_path / "link.py").symlink_to(tmp_path / "missing.py")  # a dangling link is no file
    found = sorted(path.relative_to(tmp_path).as_posix() for path in stdlib_sources(tmp_path))
    assert found == ["a/b/c.py", "json/decoder.py", "os.py"]


def test_batches_are_a_pure_function_of_split_step_and_micro():
    corpus = StdlibBytes(seq_len=16, max_bytes=100_000, seed=0)
    x, y = corpus.batch("train", step=5, micro=1, batch_size=4)
    x2, y2 = corpus.batch("train", step=5, micro=1, batch_size=4)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert torch.equal(x[:, 1:], y[:, :-1]), "targets are the inputs shifted by one"
    for other in (corpus.batch("train", 6, 1, 4), corpus.batch("train", 5, 0, 4), corpus.batch("val", 5, 1, 4)):
        assert not torch.equal(x, other[0])
    assert x.dtype == torch.int64 and int(x.max()) < 256


def test_data_parallel_ranks_split_one_global_batch():
    """However many ranks share it, the global batch is the same sequences: each rank a disjoint slice."""
    corpus = StdlibBytes(seq_len=16, max_bytes=100_000, seed=0)
    whole, _ = corpus.batch("train", 3, 0, 8)
    for num_ranks in (2, 4):
        slices = [corpus.batch("train", 3, 0, 8, rank=rank, num_ranks=num_ranks)[0] for rank in range(num_ranks)]
        assert all(len(part) == 8 // num_ranks for part in slices)
        assert torch.equal(torch.cat(slices), whole)
    with pytest.raises(ValueError, match="split evenly"):
        corpus.batch("train", 3, 0, 6, rank=0, num_ranks=4)


def test_text_files_from_folders_and_files(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    for index in range(10):
        (folder / f"note{index}.md").write_text(f"note {index}: " + "some words to learn from. " * 20)
    (folder / "skip.bin").write_bytes(b"\x00" * 1000)
    corpus = TextFiles(paths=[str(folder)], seq_len=16, seed=0)
    assert len(corpus.train_files) == 9 and len(corpus.val_files) == 1
    assert all(p.suffix == ".md" for p in corpus.train_files)
    overlapping = TextFiles(paths=[str(folder), str(folder / "note3.md")], seq_len=16, seed=0)
    assert len(overlapping.train_files) + len(overlapping.val_files) == 10, "a file named twice is read once"
    single = tmp_path / "book.txt"
    single.write_text("a long book. " * 200)
    book = TextFiles(paths=[str(single)], seq_len=16, seed=0)
    assert len(book.train) + len(book.val) == single.stat().st_size
    assert bytes(book.train[:13].tolist()) == b"a long book. "


def test_missing_or_empty_text_paths_give_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="data.paths is empty"):
        TextFiles(paths=[], seq_len=16)
    with pytest.raises(ConfigError, match="does not exist"):
        TextFiles(paths=[str(tmp_path / "missing")], seq_len=16)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.txt").write_text("")
    with pytest.raises(ConfigError, match="holds no non-empty file"):
        TextFiles(paths=[str(empty)], seq_len=16)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("too short")
    with pytest.raises(ConfigError, match="too small for data.seq_len=16"):
        TextFiles(paths=[str(tiny)], seq_len=16)


def test_synthetic_tokens_cover_the_vocabulary():
    corpus = SyntheticTokens(seq_len=8, vocab_size=50, num_tokens=10_000, seed=1)
    x, _ = corpus.batch("train", 1, 0, 64)
    assert corpus.vocab_size == 50 and int(x.max()) < 50 and len(torch.unique(corpus.train)) == 50


def test_text_val_split_holds_its_share_of_the_bytes_and_is_logged(tmp_path, caplog):
    """A val split by file count can be one small file (or the one big one); the split holds val_fraction of the
    bytes: by files chosen by size, or the tail of the bytes where no set of whole files comes near that share."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "book.txt").write_text("a long book. " * 4000)  # 52,000 bytes
    for index in range(4):
        (folder / f"note{index}.md").write_text(f"note {index} " * 100)  # 700 bytes each
    (folder / "chapter.md").write_text("a chapter. " * 500)  # 5,500 bytes: near a tenth of the whole
    with caplog.at_level("INFO", logger="currytrain.data.corpus"):
        corpus = TextFiles(paths=[str(folder)], seq_len=16, seed=0)
    share = len(corpus.val) / (len(corpus.train) + len(corpus.val))
    assert 0.05 <= share <= 0.2 and not set(corpus.train_files) & set(corpus.val_files)
    assert f"text corpus: 6 files, {len(corpus.train)} train / {len(corpus.val)} val bytes; val: {len(corpus.val_files)} whole files" in caplog.text

    pair = tmp_path / "pair"
    pair.mkdir()
    for name in ("a.txt", "b.txt"):
        (pair / name).write_text(f"{name} " * 2000)  # two equal files: holding one out would be half the bytes
    with caplog.at_level("INFO", logger="currytrain.data.corpus"):
        halves = TextFiles(paths=[str(pair)], seq_len=16, seed=0)
    assert abs(len(halves.val) / (len(halves.train) + len(halves.val)) - 0.1) < 0.01
    assert "val: the last 10% of the bytes (no set of whole files is near that share)" in caplog.text
