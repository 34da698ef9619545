"""A tiny byte-level BPE tokenizer trained by the tests themselves on the standard library's text (offline)."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

EOS = "<|endoftext|>"


def stdlib_text(max_files: int = 40) -> list[str]:
    """Some standard-library sources: real text, present wherever Python is."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 2000)[:max_files]
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def train_tokenizer(folder: Path, vocab_size: int = 320) -> Path:
    """folder/tokenizer.json (+ tokenizer_config.json naming the EOS token), trained on stdlib text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(stdlib_text(), trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder / "tokenizer.json"


def write_corpus(folder: Path, num_files: int = 6, repeat: int = 30) -> Path:
    """num_files text files of repetitive English (learnable in a few steps)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(num_files):
        line = f"document {index}: the quick brown fox jumps over the lazy dog, and the cat sat on the mat.\n"
        (folder / f"doc{index}.txt").write_text(line * repeat)
    return folder
