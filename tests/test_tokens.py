"""data=tokens: the token cache (built once, reused, rebuilt on change), the split by document, the
batches, bad inputs, and the whole path import -> fine-tune on text with the model's tokenizer -> export.

Everything is offline: the tokenizer is a tiny BPE trained here (tests/tiny_tokenizer.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("tokenizers")

from tiny_tokenizer import EOS, train_tokenizer, write_corpus  # noqa: E402

from conftest import launch  # noqa: E402
from currytrain.data.tokens import TokenizedText, dtype_for  # noqa: E402
from currytrain.errors import ConfigError  # noqa: E402

VOCAB = 320


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def corpus(tokenizer: Path, text: Path, cache: Path, **kwargs) -> TokenizedText:
    return TokenizedText(str(tokenizer), [str(text)], seq_len=16, cache_dir=str(cache), **kwargs)


def caches(folder: Path) -> list[str]:
    """The entries of a cache folder but its locks (kept, empty, once released)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def test_cache_is_built_once_reused_and_rebuilt_when_a_file_changes(tokenizer, tmp_path):
    text = write_corpus(tmp_path / "text")
    first = corpus(tokenizer, text, tmp_path / "cache")
    assert first.built and first.describe()["cache"] == "built"
    tokens_bin = first.cache / "shard-000000.bin"
    written = tokens_bin.stat().st_mtime_ns

    second = corpus(tokenizer, text, tmp_path / "cache")
    assert not second.built and second.cache == first.cache
    assert tokens_bin.stat().st_mtime_ns == written, "a reused cache is not written again"
    for split in ("train", "val"):
        a, b = first.batch(split, 3, 1, 4), second.batch(split, 3, 1, 4)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

    (text / "doc2.txt").write_text("a changed document\n" * 50)
    third = corpus(tokenizer, text, tmp_path / "cache")
    assert third.built and third.cache != first.cache
    assert caches(tmp_path / "cache") == sorted([first.cache.name, third.cache.name])  # no temporaries left


def test_documents_are_split_before_tokenization(tokenizer, tmp_path):
    """Each file is one document and lands wholly in train or in val; EOS follows every document."""
    from tokenizers import Tokenizer

    text = write_corpus(tmp_path / "text", num_files=10)
    data = corpus(tokenizer, text, tmp_path / "cache", val_fraction=0.2)
    meta = json.loads((data.cache / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["num_docs"] == 10 and data.vocab_size == VOCAB
    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id(EOS)
    docs = {}
    for split, stream in (("train", data.train), ("val", data.val)):
        assert int((stream == eos).sum()) == {"train": 8, "val": 2}[split]
        decoded = tok.decode(stream.long().tolist(), skip_special_tokens=True)
        docs[split] = {int(word.split(":")[0]) for word in decoded.split("document ")[1:]}
    assert len(docs["val"]) == 2 and len(docs["train"]) == 8 and not docs["train"] & docs["val"]

    # Another seed splits the same cache differently without tokenizing again.
    other = corpus(tokenizer, text, tmp_path / "cache", val_fraction=0.2, seed=1)
    assert not other.built and other.cache == data.cache
    assert dtype_for(VOCAB) == np.uint16 and dtype_for(2**16 + 1) == np.uint32


def test_batches_are_a_pure_function_of_their_coordinates(tokenizer, tmp_path):
    data = corpus(tokenizer, write_corpus(tmp_path / "text"), tmp_path / "cache")
    inputs, targets = data.batch("train", 5, 0, 6, rank=1, num_ranks=2)  # rank 1's half of a global batch of 6
    assert inputs.shape == targets.shape == (3, 16) and inputs.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert torch.equal(data.batch("train", 5, 0, 6, rank=1, num_ranks=2)[0], inputs)
    assert not torch.equal(data.batch("train", 5, 0, 6, rank=0, num_ranks=2)[0], inputs)
    assert not torch.equal(data.batch("train", 6, 0, 6, rank=1, num_ranks=2)[0], inputs)


def test_paragraph_documents_and_bad_inputs(tokenizer, tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    (one / "book.txt").write_text("\n\n".join(f"paragraph {i} " * 20 for i in range(12)))
    with pytest.raises(ConfigError, match="data.documents=paragraph"):
        corpus(tokenizer, one, tmp_path / "cache")
    assert corpus(tokenizer, one, tmp_path / "cache", documents="paragraph").describe()["val_tokens"] > 16

    (one / "binary.txt").write_bytes(b"\xff\xfe\x00 not utf-8")
    with pytest.raises(ConfigError, match=r"binary\.txt line 1 is not UTF-8"):
        corpus(tokenizer, one, tmp_path / "cache2", documents="paragraph")
    assert not (tmp_path / "cache2").exists() or not caches(tmp_path / "cache2")
    with pytest.raises(ConfigError, match=r"data\.eos_token=<nope> is not in the vocabulary"):
        corpus(tokenizer, write_corpus(tmp_path / "text"), tmp_path / "cache", eos_token="<nope>")


def test_the_model_takes_its_vocab_size_from_the_tokenizer(tokenizer, tmp_path):
    """TINY's model.vocab_size=256 is below the tokenizer's 320: the run takes 320 (said in the log) instead of refusing
    the config; the CLI's composition (currytrain bench, estimate) takes it too; a larger size is kept."""
    from currytrain.config import compose_config

    text = write_corpus(tmp_path / "text")
    common = ["data=tokens", f"data.paths=[{text}]", f"data.cache_dir={tmp_path / 'cache'}", f"data.tokenizer={tokenizer}", "logger=[jsonl]"]
    result = launch(*common, "trainer.max_steps=3", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"model.vocab_size={VOCAB}: the vocabulary of data.tokenizer={tokenizer} (not 256)" in result.stdout
    assert OmegaConf.load(tmp_path / "run" / "resolved.yaml").model.vocab_size == VOCAB
    assert compose_config(common).model.vocab_size == VOCAB and compose_config([*common, "model.vocab_size=512"]).model.vocab_size == 512


@pytest.mark.slow
def test_bad_configs_exit_2_before_anything_is_written(tokenizer, tmp_path):
    text = write_corpus(tmp_path / "text")
    common = ["data=tokens", f"data.paths=[{text}]", f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"]
    missing = launch(*common, f"data.tokenizer={tmp_path / 'absent'}", f"model.vocab_size={VOCAB}")
    assert missing.returncode == 2 and "data.tokenizer=" in missing.stderr and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_import_finetune_on_text_and_export(tokenizer, tmp_path):
    """An HF model with its tokenizer: import, run the experiment the import wrote on local text for 20 steps
    (the loss falls), export, and transformers loads the result with the tokenizer files."""
    transformers = pytest.importorskip("transformers")
    from currytrain.hf import import_hf

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    assert config.max_position_embeddings > 512  # a real context: the experiment must shorten it
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "hf" / name).write_bytes((tokenizer.parent / name).read_bytes())
    imported = import_hf(str(tmp_path / "hf"), tmp_path / "imported")
    experiment = (imported / "experiment" / "finetune.yaml").read_text()
    assert "override /model: gqa" in experiment and "max_seq_len: 512" in experiment and f"init_from: {imported.resolve()}" in experiment

    run = tmp_path / "run"
    result = launch(
        f"hydra.searchpath=[file://{imported.resolve()}]",
        "experiment=finetune",
        f"data.paths=[{write_corpus(tmp_path / 'text', num_files=8)}]",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.seq_len=64",
        "trainer.max_steps=20",
        "trainer.eval_every=20",
        "trainer.eval_batches=2",
        "trainer.log_every=1",
        "optimizer.lr=3e-3",
        "optimizer.schedule.warmup_steps=2",
        "logger=[jsonl]",
        "trainer.progress=false",
        f"hydra.run.dir={run}",
        tiny=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in (run / "journal.jsonl").read_text().splitlines()]
    losses = [e["train/loss"] for e in events if e["type"] == "metrics" and "train/loss" in e]
    assert len(losses) >= 2 and losses[-1] < losses[0] - 0.5, losses
    start = next(e for e in events if e["type"] == "start")
    assert start["data"]["vocab_size"] == VOCAB and start["data"]["cache"] == "built"

    from currytrain.hf import export_hf

    out = export_hf(run, tmp_path / "exported")
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.max_position_embeddings == config.max_position_embeddings  # trained at 64, the context stays
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    prompt = torch.tensor([hf_tokenizer.encode("document 3: the quick")])
    assert model(prompt).logits.shape == (1, prompt.shape[1], VOCAB)


def test_jsonl_records_are_documents_and_a_missing_field_is_named(tokenizer, tmp_path):
    folder = tmp_path / "jsonl"
    folder.mkdir()
    records = [{"text": f"record {i}: the quick brown fox jumps over the lazy dog. " * 8, "id": i} for i in range(10)]
    (folder / "part.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    data = corpus(tokenizer, folder, tmp_path / "cache", val_fraction=0.2)
    assert json.loads((data.cache / "meta.json").read_text())["num_docs"] == 10

    (folder / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(ConfigError, match=r"data.text_field=text: .*bad\.jsonl line 2 has no string field 'text' \(it has \['body'\]\)"):
        corpus(tokenizer, folder, tmp_path / "cache")
    (folder / "bad.jsonl").write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl line 2 is not JSON"):
        corpus(tokenizer, folder, tmp_path / "cache")
    assert caches(tmp_path / "cache") == [data.cache.name], "nothing half-written"


def test_parquet_rows_are_documents_and_bad_files_are_named(tokenizer, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    folder = tmp_path / "parquet"
    folder.mkdir()
    texts = [f"row {i}: the cat sat on the mat and the dog ran. " * 6 for i in range(8)]
    pq.write_table(pa.table({"content": texts, "id": list(range(8))}), folder / "rows.parquet")
    with pytest.raises(ConfigError, match=r"data.text_field=text: .*rows\.parquet has no column 'text' \(it has \['content', 'id'\]\)"):
        corpus(tokenizer, folder, tmp_path / "cache")
    data = corpus(tokenizer, folder, tmp_path / "cache", text_field="content", val_fraction=0.25)
    assert json.loads((data.cache / "meta.json").read_text())["num_docs"] == 8

    (folder / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ConfigError, match=r"broken\.parquet is not a readable Parquet file"):
        corpus(tokenizer, folder, tmp_path / "cache", text_field="content")


def test_a_hugging_face_datasets_folder_is_read_offline(tokenizer, tmp_path):
    """save_to_disk writes .arrow files (as the datasets cache holds them): every row of every split is a
    document, read by pyarrow without the Hub; a missing column names the file and what it has."""
    datasets = pytest.importorskip("datasets")
    rows = {"train": [f"train row {i}: a bird sang in the tall green tree. " * 6 for i in range(9)], "test": ["the test row. " * 12] * 3}
    folder = tmp_path / "saved"
    datasets.DatasetDict({name: datasets.Dataset.from_dict({"body": texts}) for name, texts in rows.items()}).save_to_disk(str(folder))
    assert list(folder.rglob("*.arrow"))
    data = corpus(tokenizer, folder, tmp_path / "cache", text_field="body", val_fraction=0.25)
    assert json.loads((data.cache / "meta.json").read_text())["num_docs"] == 12
    with pytest.raises(ConfigError, match=r"data.text_field=text: .*\.arrow has no column 'text' \(it has \['body'\]\)"):
        corpus(tokenizer, folder, tmp_path / "cache")
    (folder / "broken.arrow").write_bytes(b"ARROW1 not really")
    with pytest.raises(ConfigError, match=r"broken\.arrow is not a readable Arrow file"):
        corpus(tokenizer, folder, tmp_path / "cache", text_field="body")
