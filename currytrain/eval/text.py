"""Text to token ids and back, as a run's data made them: bytes (vocab 256, the byte corpora) or a local
tokenizer (data.tokenizer, an import's hf/tokenizer.json). Generation and the evaluators read text through it.

A Codec encodes a string to ids and decodes ids to a string; a Stream turns ids arriving one at a time into the
text they complete (a UTF-8 character split over several bytes or tokens is printed once it is whole).
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from currytrain.data.tokenizer import TOKENIZER_FILE, load_tokenizer

REPLACEMENT = "\ufffd"
"""What decoding makes of bytes that are not (yet) whole UTF-8 characters."""


@dataclass
class Codec:
    """Encode and decode text for one model. name: what it is, for messages (bytes, or the tokenizer's file)."""

    name: str
    vocab_size: int
    stop_ids: frozenset[int] = frozenset()
    """Token ids that end a generation (the tokenizer's EOS tokens); none for bytes."""
    prefix_id: int | None = None
    """The id a document starts from when nothing precedes it (lm-eval's rolling loglikelihood conditions the
    first token on it): the EOS (else BOS) token of a tokenizer, the newline byte for bytes."""
    tokenizer: Any = field(default=None, repr=False)

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return list(text.encode("utf-8"))
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return bytes(ids).decode("utf-8", errors="replace")
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def stream(self) -> Stream:
        return Stream(self)


class Stream:
    """The text of ids arriving one at a time: push(id) returns what is new and whole, finish() the rest."""

    def __init__(self, codec: Codec):
        self.codec = codec
        self.ids: list[int] = []
        self.shown = 0
        self.bytes = codecs.getincrementaldecoder("utf-8")(errors="replace") if codec.tokenizer is None else None

    def push(self, token: int) -> str:
        if self.bytes is not None:
            return self.bytes.decode(bytes([token]))
        self.ids.append(token)
        text = self.codec.decode(self.ids)
        if text.endswith(REPLACEMENT):  # a character split over tokens: wait for its end
            return ""
        new, self.shown = text[self.shown :], len(text)
        return new

    def finish(self) -> str:
        if self.bytes is not None:
            return self.bytes.decode(b"", final=True)
        text = self.codec.decode(self.ids)
        new, self.shown = text[self.shown :], len(text)
        return new


def byte_codec() -> Codec:
    return Codec("bytes", 256, prefix_id=ord("\n"))


def tokenizer_codec(path: Path, eos_token: str = "auto") -> Codec:
    """The Codec of a tokenizer.json; its stop ids are the EOS tokens its folder names (tokenizer_config.json's
    eos_token, a generation_config.json's or config.json's eos_token_id, or data.eos_token when given)."""
    from currytrain.data.tokenizer import eos_id, vocab_size_of

    tokenizer = load_tokenizer(path)
    stops = set(folder_eos_ids(path.parent))
    eos = eos_id(tokenizer, path, eos_token if eos_token != "none" else "auto")
    if eos is not None:
        stops.add(eos)
    bos = _token_id(tokenizer, path.parent, "bos_token")
    prefix = eos if eos is not None else min(stops) if stops else bos
    return Codec(str(path), vocab_size_of(tokenizer), frozenset(stops), prefix, tokenizer)


def folder_eos_ids(folder: Path) -> list[int]:
    """The eos_token_id(s) of a Hugging Face folder's generation_config.json and config.json (none when absent)."""
    found: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text()).get("eos_token_id")
        except (ValueError, AttributeError):
            continue
        found += [int(v) for v in (value if isinstance(value, list) else [value]) if isinstance(v, int)]
    return found


def _token_id(tokenizer: Any, folder: Path, key: str) -> int | None:
    """The id of tokenizer_config.json's `key` token (bos_token, eos_token), None when it names none."""
    config = folder / "tokenizer_config.json"
    try:
        token = json.loads(config.read_text()).get(key) if config.is_file() else None
    except ValueError:
        return None
    if isinstance(token, dict):
        token = token.get("content")
    return tokenizer.token_to_id(token) if isinstance(token, str) else None


def find_folder_tokenizer(folder: Path) -> Path | None:
    """The tokenizer.json of a Hugging Face folder (an import's hf/), or None."""
    path = folder / TOKENIZER_FILE
    return path if path.is_file() else None
