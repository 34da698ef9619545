"""Finding and reading a local tokenizer (torch-free: validation calls it before anything is written).

data.tokenizer names a tokenizer.json, a folder holding one (a Hugging Face model folder), or a
`currytrain hf import` folder (whose tokenizer lies in hf/). The `tokenizers` library reads it; nothing
is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from currytrain.errors import ConfigError

TOKENIZER_FILE = "tokenizer.json"


def find_tokenizer(entry: str) -> tuple[Path | None, str | None]:
    """(the tokenizer.json that data.tokenizer names, None) or (None, the problem with the fix)."""
    path = Path(entry).expanduser()
    if entry in ("", "???"):
        return None, "data.tokenizer is not set: pass data.tokenizer=<tokenizer.json, a model folder or a currytrain hf import folder>"
    if path.is_file():
        return path, None
    for candidate in (path / TOKENIZER_FILE, path / "hf" / TOKENIZER_FILE):
        if candidate.is_file():
            return candidate, None
    if path.is_dir():
        return None, f"data.tokenizer={entry} holds no {TOKENIZER_FILE} (nor hf/{TOKENIZER_FILE}): pass a folder with a fast tokenizer's {TOKENIZER_FILE}"
    return None, f"data.tokenizer={entry} does not exist: pass a {TOKENIZER_FILE}, a model folder or a currytrain hf import folder"


def require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ConfigError("data=tokens needs the tokenizers library: pip install 'currytrain[tokens]'") from None
    return tokenizers


def load_tokenizer(path: Path) -> Any:
    """The tokenizers.Tokenizer in `path`, or a ConfigError naming the file."""
    tokenizers = require_tokenizers()
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # the Rust side raises plain Exceptions for any parse error
        raise ConfigError(f"data.tokenizer: {path} cannot be read by tokenizers {tokenizers.__version__} ({error}): pass a valid {TOKENIZER_FILE}") from None


def vocab_size_of(tokenizer: Any) -> int:
    """Token ids the tokenizer can emit: one past its largest id (added tokens included)."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def tokenizer_vocab_size(entry: str) -> tuple[int | None, str | None]:
    """(vocab size of data.tokenizer, None) or (None, the problem); for the cross-group vocab check."""
    path, problem = find_tokenizer(entry)
    if problem:
        return None, problem
    try:
        return vocab_size_of(load_tokenizer(path)), None
    except ConfigError as error:
        return None, str(error)


def eos_id(tokenizer: Any, tokenizer_path: Path, eos_token: str) -> int | None:
    """The id appended after each document: data.eos_token, or with `auto` the eos_token of the
    tokenizer_config.json beside tokenizer.json (None when it names none); `none` appends nothing."""
    if eos_token == "none":
        return None
    if eos_token == "auto":
        config = tokenizer_path.parent / "tokenizer_config.json"
        token = json.loads(config.read_text()).get("eos_token") if config.is_file() else None
        if isinstance(token, dict):  # older files store an AddedToken dict
            token = token.get("content")
        if not token:
            return None
    else:
        token = eos_token
    found = tokenizer.token_to_id(token)
    if found is None:
        raise ConfigError(f"data.eos_token={token} is not in the vocabulary of {tokenizer_path}: pass data.eos_token=none or a token it has")
    return found
