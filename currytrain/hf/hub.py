"""Where a Hugging Face checkpoint comes from: a local folder, the HF cache, or the Hub.

Nothing here may hang. huggingface_hub's shared HTTP client has no timeout of its own and name
resolution is not bounded by socket timeouts, so the one network call that decides "online or
not" runs in a daemon thread with a deadline; when it does not answer in time the cache is used,
and when the cache has nothing the user is told which local folder to pass.
"""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import Any

from currytrain.errors import ConfigError

log = logging.getLogger(__name__)

HUB_TIMEOUT_S = 5.0
"""Seconds the Hub gets to answer the first request (name lookup included) before the cache is used."""

# What an import reads from a Hub repo: the config, safetensors weights, the tokenizer and generation
# settings (copied through to exports). Never pickled *.bin weights.
ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "tokenizer*",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template*",
]

_REPO_ID = re.compile(r"^(?:[\w\-.]+/)?[\w\-.]+$")


def looks_like_repo_id(source: str) -> bool:
    return bool(_REPO_ID.match(source)) and not source.startswith((".", "~")) and ".." not in source


def resolve_source(source: str, revision: str | None = None) -> Path:
    """The local folder holding `source`'s config.json and weights, downloading it when that is possible."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ConfigError(f"{source} is a file: pass the folder that holds config.json and the *.safetensors weights")
    # "runs/x" is also a well-formed Hub id; an existing local parent folder says a path was meant.
    if not looks_like_repo_id(source) or ("/" in source and path.parent.is_dir()):
        raise ConfigError(f"{source} does not exist: pass an existing folder (with config.json) or a Hub id such as org/name")
    return _from_hub(source, revision)


def _not_available(repo_id: str, cache: str, why: str) -> ConfigError:
    return ConfigError(
        f"{repo_id} is not a local folder, {why}, and it is not in the Hugging Face cache ({cache}). "
        f"On a machine with Hub access run `hf download {repo_id} --local-dir DIR`, copy DIR here and pass "
        f"the folder itself: `currytrain hf import DIR` (or point HF_HOME / HF_HUB_CACHE at a cache that holds it)"
    )


def _from_hub(repo_id: str, revision: str | None) -> Path:
    hub = _require_hub()
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    cache = constants.HF_HUB_CACHE
    if constants.HF_HUB_OFFLINE:
        why = "HF_HUB_OFFLINE=1 forbids downloads"
        commit = None
    else:
        answer = _probe(hub, repo_id, revision)
        if isinstance(answer, (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError)):
            what = f"revision {revision} of {repo_id}" if isinstance(answer, RevisionNotFoundError) else repo_id
            raise ConfigError(
                f"{what} was not found on the Hub or is gated ({type(answer).__name__}): check the id, "
                "log in with `hf auth login` for gated models, or pass a local folder"
            )
        if isinstance(answer, BaseException) or answer is None:
            why = f"the Hub did not answer within {HUB_TIMEOUT_S:.0f} s" if answer is None else f"the Hub is unreachable ({type(answer).__name__})"
            log.warning("%s: %s; looking in the cache %s", repo_id, why, cache)
            commit = None
        else:
            commit = answer
    if commit is not None:
        # Pinning the commit the probe saw skips a second, unbounded metadata request.
        folder = hub.snapshot_download(repo_id, revision=commit, allow_patterns=ALLOW_PATTERNS, etag_timeout=HUB_TIMEOUT_S)
        return Path(folder)
    try:
        folder = hub.snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS, local_files_only=True)
    except LocalEntryNotFoundError:
        raise _not_available(repo_id, cache, why) from None
    log.info("using the cached snapshot %s", folder)
    return Path(folder)


def _probe(hub: Any, repo_id: str, revision: str | None) -> str | BaseException | None:
    """The commit sha the Hub resolves `revision` to, the exception it raised, or None on a timeout."""
    result: list[Any] = [None]

    def ask() -> None:
        try:
            result[0] = hub.HfApi().model_info(repo_id, revision=revision, timeout=HUB_TIMEOUT_S).sha
        except BaseException as error:  # reported to the caller, which decides
            result[0] = error

    thread = threading.Thread(target=ask, name="currytrain-hub-probe", daemon=True)
    thread.start()
    thread.join(HUB_TIMEOUT_S)
    return result[0]


def _require_hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise ConfigError("importing from the Hub needs huggingface_hub: pip install 'currytrain[hf]', or pass a local folder") from None
    return huggingface_hub
