"""Preparing a corpus at scale (currytrain/data/prepare.py): pieces that read exactly the documents of whole
files, a preparation killed with SIGKILL that resumes without redoing its finished shards, one process
preparing while the ranks of a data-parallel run wait, mixtures drawn by weight with exact resume, and bad
input refused naming the file and line without leaving a cache a later run would trust.

Everything is offline: the tokenizer is a tiny BPE trained here (tests/tiny_tokenizer.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers")

from tiny_tokenizer import EOS, train_tokenizer, write_corpus  # noqa: E402

from conftest import ROOT, launch  # noqa: E402
from currytrain.cli import main as currytrain_main  # noqa: E402
from currytrain.data import readers  # noqa: E402
from currytrain.data.prepare import META  # noqa: E402
from currytrain.data.readers import Piece, plan_pieces, read_piece  # noqa: E402
from currytrain.data.sources import prepare_data, verify_data  # noqa: E402
from currytrain.data.tokens import TokenizedText  # noqa: E402
from currytrain.errors import ConfigError  # noqa: E402

VOCAB = 320


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return path


def overrides(tokenizer: Path, paths: list[Path], cache: Path, *more: str) -> list[str]:
    return ["data=tokens", f"data.tokenizer={tokenizer}", f"data.paths=[{','.join(map(str, paths))}]", f"data.cache_dir={cache}", *more]


def data_fields(cfg) -> dict:
    """The resolved data node, as `currytrain data` hands it on."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg.data, resolve=True)


def finished(cache: Path) -> list[Path]:
    return sorted(path for path in cache.iterdir() if (path / META).is_file()) if cache.is_dir() else []


def shard_tokens(folder: Path) -> np.ndarray:
    return np.concatenate([np.fromfile(path, dtype=np.uint16) for path in sorted(folder.glob("shard-*.bin"))])


# ----------------------------------------------------------------------------------------------- readers

PARAGRAPHS = st.lists(st.sampled_from(["word", "é", " ", "  ", "\t", "\n", "\n\n", "\n \n", " \n\n \n ", "x."]), max_size=60).map("".join)


@settings(max_examples=150)
@given(text=PARAGRAPHS, piece_bytes=st.integers(1, 40), block=st.integers(1, 16))
def test_pieces_of_a_text_file_yield_its_paragraphs(tmp_path_factory, text, piece_bytes, block):
    """However a file is cut into pieces and read in blocks, its pieces yield the paragraphs of the whole text."""
    path = tmp_path_factory.mktemp("text") / "book.txt"
    path.write_bytes(text.encode())
    expected = [part for part in re.split(r"\n\s*\n", text, flags=re.ASCII) if part.strip()]
    saved, readers.BLOCK = readers.BLOCK, block
    try:
        pieces = plan_pieces([path], "paragraph", piece_bytes) if text else []
        found = [segment.text for piece in pieces for segment in read_piece(piece, "text")]
    finally:
        readers.BLOCK = saved
    assert found == expected


@settings(max_examples=60)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=12), piece_bytes=st.integers(1, 200))
def test_pieces_of_a_jsonl_file_yield_each_record_once(tmp_path_factory, lengths, piece_bytes):
    texts = [f"record {index} " + "y" * length for index, length in enumerate(lengths)]
    path = write_jsonl(tmp_path_factory.mktemp("lines") / "part.jsonl", texts)
    pieces = plan_pieces([path], "file", piece_bytes)
    assert [segment.text for piece in pieces for segment in read_piece(piece, "text")] == texts


def test_a_long_document_is_encoded_in_blocks_as_it_is_whole(tokenizer, tmp_path, monkeypatch):
    """A text file longer than a block is one document, cut at newlines between non-space characters only; the
    tokens of its blocks are those of the whole text."""
    from tokenizers import Tokenizer

    text = "".join(f"line {i}: the cat sat.\n" + ("  indented\n\n" if i % 7 == 0 else "") for i in range(300))
    path = tmp_path / "long.txt"
    path.write_text(text)
    monkeypatch.setattr(readers, "BLOCK", 256)
    tok = Tokenizer.from_file(str(tokenizer))
    assert readers.piecewise_safe(tok)
    segments = list(read_piece(Piece(str(path), "file", 0, path.stat().st_size), "text"))
    assert len(segments) > 10 and "".join(s.text for s in segments) == text and [s.ends for s in segments].count(True) == 1
    assert all(s.text[-1] == "\n" and not s.text[-2].isspace() for s in segments[:-1])
    pieces = [tok.encode(s.text, add_special_tokens=False).ids for s in segments]
    assert sum(pieces, []) == tok.encode(text, add_special_tokens=False).ids


# ---------------------------------------------------------------------------------------- kill and resume


@pytest.mark.slow
def test_a_preparation_killed_with_sigkill_resumes_without_redoing_its_finished_shards(tokenizer, tmp_path):
    words = "the quick brown fox jumps over the lazy dog while a cat sat on the mat".split()
    texts = [" ".join(words[(i + j) % len(words)] for j in range(400)) + f" ({i})" for i in range(1700)]
    corpus = write_jsonl(tmp_path / "corpus.jsonl", texts)  # ~3 MiB: 3 shards of 1 MiB
    args = overrides(tokenizer, [corpus], tmp_path / "cache", "data.shard_mb=1", "data.workers=2")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.Popen([sys.executable, "-m", "currytrain.cli", "data", "prepare", *args], cwd=ROOT, env=env, stderr=subprocess.PIPE)
    partial = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and killed.poll() is None:
        partial = list((tmp_path / "cache").glob(".*.partial/shard-*.json"))
        if partial:
            break
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert partial and not finished(tmp_path / "cache"), "killed after its first shard, before the last"
    kept = {path: path.with_suffix(".bin").stat().st_ino for path in partial}

    assert currytrain_main(["data", "prepare", *args]) == 0
    [folder] = finished(tmp_path / "cache")
    meta = json.loads((folder / META).read_text())
    assert len(meta["shards"]) == 3 and not list((tmp_path / "cache").glob(".*.partial"))
    for path, inode in kept.items():
        assert (folder / path.with_suffix(".bin").name).stat().st_ino == inode, "a finished shard was not redone"

    assert currytrain_main(["data", "prepare", *overrides(tokenizer, [corpus], tmp_path / "whole", "data.workers=1")]) == 0
    [whole] = finished(tmp_path / "whole")
    assert np.array_equal(shard_tokens(folder), shard_tokens(whole)), "the resumed cache holds the tokens of an uninterrupted one"


# ------------------------------------------------------------------------------------- one process prepares


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_ranks_of_a_ddp_run_on_an_unprepared_corpus_tokenize_it_once(tokenizer, tmp_path):
    text = write_corpus(tmp_path / "text", num_files=6)
    run = tmp_path / "run"
    args = overrides(tokenizer, [text], tmp_path / "cache", f"model.vocab_size={VOCAB}", "parallel=ddp", "parallel.nproc=2")
    result = launch(*args, "trainer.max_steps=3", "trainer.eval_every=3", f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-3000:]
    logs = [(run / "workers" / f"rank_{rank}.stderr").read_text() for rank in range(2)]
    assert "token cache prepared by this process" in logs[0] and "token cache" not in logs[1], logs  # rank 1 waits quietly
    [folder] = finished(tmp_path / "cache")
    rank_0 = int(re.search(r"rank 0 pid (\d+)", (run / "workers" / "rank_0.stdout").read_text()).group(1))
    assert json.loads((folder / META).read_text())["prepared_by"]["pid"] == rank_0
    start = next(json.loads(line) for line in (run / "journal.jsonl").read_text().splitlines() if '"start"' in line)
    assert start["data"]["cache"] == "built"


def test_a_waiting_process_names_the_holder_and_gives_up_after_prepare_wait(tokenizer, tmp_path):
    """Another process holds the cache's lock (as while it prepares): a run waits, names it, and stops after
    data.prepare_wait seconds without a new shard, exit 2; when the holder dies, the lock is taken over."""
    from currytrain import lock
    from currytrain.data.prepare import CorpusSpec

    text = write_corpus(tmp_path / "text")
    spec = CorpusSpec(tuple(sorted(text.iterdir())), tokenizer, 0, "file", "text")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from currytrain import lock; lock.try_hold(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)",
         str(tmp_path / "cache" / f".{spec.key()}.lock")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"is being prepared by pid {holder.pid} on .* no shard has been finished for .*data.prepare_wait=1"):
            TokenizedText(str(tokenizer), [str(text)], seq_len=16, cache_dir=str(tmp_path / "cache"), eos_token=EOS, prepare_wait=1)
    finally:
        holder.kill()
        holder.wait()
    data = TokenizedText(str(tokenizer), [str(text)], seq_len=16, cache_dir=str(tmp_path / "cache"), eos_token=EOS, prepare_wait=1)
    assert data.built
    released = lock.try_hold(tmp_path / "cache" / f".{spec.key()}.lock")
    assert isinstance(released, lock.RunLock)
    released.release()


def test_progress_off_a_terminal_is_a_line_of_rates_and_eta(tokenizer, tmp_path, monkeypatch, caplog):
    from currytrain.data import prepare

    monkeypatch.setattr(prepare, "NOTE_EVERY_S", 0.0)
    with caplog.at_level("INFO", logger="currytrain.data.prepare"):
        TokenizedText(str(tokenizer), [str(write_corpus(tmp_path / "text"))], seq_len=16, cache_dir=str(tmp_path / "cache"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tokenizing")]
    assert lines and re.fullmatch(r"tokenizing \w+: [\d.]+ of [\d.]+ GB \(100%\), [\d.]+ MB/s, \d+ docs/s, [\d.]+M tokens/s, ETA 0:00:00", lines[-1]), lines


# ---------------------------------------------------------------------------------------------- mixtures


def mixture(tokenizer: Path, tmp_path: Path, **kwargs) -> TokenizedText:
    web, code = tmp_path / "web" / "part.jsonl", tmp_path / "code" / "part.jsonl"
    if not web.exists():
        write_jsonl(web, [f"page {i}: the cat sat on the mat. " * 6 for i in range(12)])
        write_jsonl(code, [f"def f{i}(x):\n    return x + {i}\n" * 6 for i in range(12)])
    sources = {"web": {"path": str(web), "weight": 0.8}, "code": {"path": str(code), "weight": 0.2}}
    return TokenizedText(str(tokenizer), [], seq_len=16, sources=sources, cache_dir=str(tmp_path / "cache"), **kwargs)


def test_a_mixture_draws_each_source_by_its_weight_and_resumes_exactly(tokenizer, tmp_path):
    data = mixture(tokenizer, tmp_path)
    assert len(finished(tmp_path / "cache")) == 2 and data.describe()["sources"]["web"]["weight"] == 0.8
    web, code = (set(stream.tolist()) if isinstance(stream, torch.Tensor) else None for stream in data.train.streams)
    only_code = code - web
    windows = torch.cat([data.batch("train", step, 0, 100)[0] for step in range(100)])
    from_code = sum(bool(set(row.tolist()) & only_code) for row in windows)
    assert len(windows) == 10_000 and abs(from_code / 10_000 - 0.2) < 0.01, from_code

    again = mixture(tokenizer, tmp_path)  # a resumed run builds its data anew
    assert not again.built
    for step in (1, 7, 55):
        assert torch.equal(again.batch("train", step, 1, 8)[0], data.batch("train", step, 1, 8)[0])
        halves = [again.batch("train", step, 1, 8, rank=rank, num_ranks=2)[0] for rank in range(2)]
        assert torch.equal(torch.cat(halves), data.batch("train", step, 1, 8)[0]), "the ranks' slices make the global batch"
    assert not torch.equal(data.batch("train", 1, 0, 8)[0], data.batch("train", 2, 0, 8)[0])


def test_a_mixture_is_a_file_of_the_data_sources_group(tokenizer, tmp_path, compose_cfg):
    """A project's conf/data/sources/<name>.yaml is chosen with data/sources=<name>, so sweeps can vary it."""
    from currytrain.validate import validate

    web, code = write_corpus(tmp_path / "web"), write_corpus(tmp_path / "code")
    (tmp_path / "conf" / "data" / "sources").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "sources" / "mix.yaml").write_text(f"web: {{path: {web}, weight: 3}}\ncode: {{path: {code}}}\n")
    args = overrides(tokenizer, [], tmp_path / "cache", f"model.vocab_size={VOCAB}", f"hydra.searchpath=[file://{tmp_path / 'conf'}]")
    cfg = compose_cfg(*args, "data/sources=mix", "data.sources.code.weight=0.5")
    assert {name: source.weight for name, source in cfg.data.sources.items()} == {"web": 3.0, "code": 0.5}
    assert validate(cfg) == []
    bad = compose_cfg(*args, "data/sources=mix", f"data.paths=[{web}]", "data.sources.code.path=/nowhere")
    problems = validate(bad)
    assert any("data.paths and data.sources are both set" in p for p in problems) and any(
        "data.sources.code.path: /nowhere does not exist" in p for p in problems
    )


# ------------------------------------------------------------------------------------------- bad input


def test_bad_input_exits_2_naming_the_file_and_line_and_leaves_no_cache(tokenizer, tmp_path, capsys, compose_cfg):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    cases = {}
    folder = tmp_path / "utf8"
    folder.mkdir()
    (folder / "a.txt").write_text("fine text\n\nmore\n")
    (folder / "b.txt").write_bytes(b"first paragraph\n\nsecond\nthird \xff\xfe line\n")
    cases["utf8"] = ([folder], ["data.documents=paragraph"], r"b\.txt line 4 is not UTF-8 text")
    good = [{"text": "fine"}] * 3
    (tmp_path / "json.jsonl").write_text("\n".join(json.dumps(r) for r in good) + "\n{not json\n")
    cases["json"] = ([tmp_path / "json.jsonl"], [], r"json\.jsonl line 4 is not JSON")
    (tmp_path / "field.jsonl").write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"body": "no text"}) + "\n")
    cases["field"] = ([tmp_path / "field.jsonl"], [], r"data.text_field=text: .*field\.jsonl line 2 has no string field 'text' \(it has \['body'\]\)")
    (tmp_path / "surrogate.jsonl").write_text(json.dumps({"text": "ok"}) + "\n" + '{"text": "half a pair \\ud83d here"}\n')
    cases["surrogate"] = ([tmp_path / "surrogate.jsonl"], [], r"surrogate\.jsonl line 2 holds text that is not valid Unicode")
    pq.write_table(pa.table({"content": ["a row of text"] * 4}), tmp_path / "rows.parquet")
    cases["column"] = ([tmp_path / "rows.parquet"], [], r"rows\.parquet has no column 'text' \(it has \['content'\]\)")
    for name, (paths, more, message) in cases.items():
        cache = tmp_path / f"cache-{name}"
        args = overrides(tokenizer, paths, cache, *more)
        if name == "utf8":  # the command, as a user runs it
            assert currytrain_main(["data", "prepare", *args]) == 2
            assert re.search(message, capsys.readouterr().err)
        else:
            with pytest.raises(ConfigError, match=message):
                prepare_data(data_fields(compose_cfg(*args)))
        assert not [p for p in cache.iterdir() if not p.name.endswith(".lock")], f"{name}: nothing half-written stays"


def test_a_damaged_cache_is_refused_by_a_run_and_mended_by_data_prepare(tokenizer, tmp_path, capsys, compose_cfg):
    text = write_corpus(tmp_path / "text")
    big = text / "big.txt"
    big.write_text("the cat sat on the mat.\n" * 12_000)  # longer than the two edges the manifest hashes
    args = overrides(tokenizer, [text], tmp_path / "cache", "data.shard_mb=1")
    fields = data_fields(compose_cfg(*args))
    assert currytrain_main(["data", "prepare", *args]) == 0
    [folder] = finished(tmp_path / "cache")
    good = (folder / "shard-000000.bin").read_bytes()
    (folder / "shard-000000.bin").write_bytes(good[:-6])  # a cut write
    with pytest.raises(ConfigError, match=r"token cache .* \(data\.cache_dir\) is damaged: .*shard-000000\.bin holds \d+ bytes.*currytrain data prepare"):
        TokenizedText(str(tokenizer), [str(text)], seq_len=16, cache_dir=str(tmp_path / "cache"))
    assert currytrain_main(["data", "verify", *args]) == 2
    assert "shard-000000.bin" in capsys.readouterr().err

    (folder / "shard-000000.bin").write_bytes(good[:2] + bytes([good[2] ^ 1]) + good[3:])  # same size, one id changed
    TokenizedText(str(tokenizer), [str(text)], seq_len=16, cache_dir=str(tmp_path / "cache"))  # sizes only at a run start
    with pytest.raises(ConfigError, match="shard-000000.bin does not match its checksum"):
        verify_data(fields)
    prepare_data(fields)
    assert (folder / "shard-000000.bin").read_bytes() == good
    assert verify_data(fields) == [f"data: {folder}: ok"]

    meta = (folder / META).read_text()
    (folder / META).write_text(meta[: len(meta) // 2])  # a cut meta.json
    with pytest.raises(ConfigError, match=r"meta\.json cannot be read"):
        TokenizedText(str(tokenizer), [str(text)], seq_len=16, cache_dir=str(tmp_path / "cache"))
    prepare_data(fields)
    assert json.loads((folder / META).read_text()) == json.loads(meta) | {"prepared_by": json.loads((folder / META).read_text())["prepared_by"]}

    stat, data = big.stat(), bytearray(big.read_bytes())
    data[len(data) // 2] = ord("X")  # same size, edges and modification time: only a full hash sees it
    big.write_bytes(bytes(data))
    os.utime(big, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ConfigError, match=r"big\.txt bytes 0-\d+ changed since the cache was prepared"):
        verify_data(fields)


# ------------------------------------------------------------------------------- document-aware packing


def test_document_layout_restarts_positions_and_masks_across_documents():
    from currytrain.model.decoder import document_layout

    tokens = torch.tensor([[5, 6, 0, 7, 8, 9, 0, 4], [1, 2, 3, 4, 5, 6, 7, 8]])  # 0 ends a document
    positions, mask = document_layout(tokens, 0, True, True)
    assert positions.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], list(range(8))]
    assert mask.shape == (2, 1, 8, 8)
    assert mask[0, 0, 4].tolist() == [False, False, False, True, True, False, False, False]  # token 4 sees its document's 3 and 4
    assert torch.equal(mask[1, 0], torch.ones(8, 8, dtype=torch.bool).tril())
    assert document_layout(tokens, 0, False, False)[0].tolist() == [list(range(8))] * 2


def test_a_packed_document_is_seen_as_if_alone(compose_cfg):
    """With both options, the logits of a document packed after another equal its logits alone: positions restart
    and attention does not reach back into the previous document. Without them, they differ."""
    from currytrain.model import build_model

    cfg = compose_cfg("model.vocab_size=64", "model.max_seq_len=16")
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    first, second = torch.tensor([[5, 9, 11, 3, 0]]), torch.tensor([[7, 2, 13, 8, 21, 4]])  # 0 ends the first
    packed = torch.cat([first, second], dim=1)
    with torch.no_grad():
        alone = model(second)[0]
        plain = model(packed)[0, first.shape[1] :]
        model.use_document_boundaries(0, restart_positions=True, masked=True)
        aware = model(packed)[0, first.shape[1] :]
        assert torch.equal(model(second)[0], alone), "a window of one document is unchanged"
    assert torch.allclose(aware, alone, atol=1e-5) and not torch.allclose(plain, alone, atol=1e-3)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_run_packs_documents_when_asked_and_refuses_what_cannot(tokenizer, tmp_path, compose_cfg):
    from currytrain.validate import validate

    text = write_corpus(tmp_path / "text")
    args = overrides(tokenizer, [text], tmp_path / "cache", f"model.vocab_size={VOCAB}", "data.restart_positions=true", "data.mask_documents=true")
    result = launch(*args, "trainer.max_steps=3", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr[-3000:]
    problems = validate(compose_cfg(*args, "parallel=cp", "parallel.nproc=2", "parallel.cp=2"))
    assert any("cannot go with parallel.cp=2" in problem for problem in problems), problems
    problems = validate(compose_cfg(*args, "model=spiking"))
    assert any("needs a RoPE decoder (model=gqa or model=moe)" in problem for problem in problems), problems
    with pytest.raises(ConfigError, match=r"pass data.eos_token=<a token of the vocabulary>"):
        TokenizedText(str(tokenizer), [str(text)], seq_len=16, cache_dir=str(tmp_path / "cache"), eos_token="none", restart_positions=True)


@pytest.mark.parametrize("action", ["prepare", "verify"])
def test_data_prepare_on_data_that_is_not_tokens_names_the_fix(action, capsys):
    """`currytrain data prepare` without data=tokens (the default data=bytes has no workers or shards to read):
    exit 2 naming data=tokens, with one "curryTrain:" before the message, not a KeyError."""
    assert currytrain_main(["data", action, "data=bytes"]) == 2
    err = capsys.readouterr().err
    assert "currytrain data prepares data=tokens" in err and "pass data=tokens" in err
    assert "curryTrain: curryTrain:" not in err
