"""What every data source shares, at the bottom of the data package: the byte vocabulary and the seeds
that make a batch the same in every process. It imports nothing of curryTrain."""

from __future__ import annotations

import hashlib

BYTE_VOCAB = 256
"""Vocabulary of the byte-level corpora: token id = byte value."""


def stable_seed(*parts) -> int:
    """A 63-bit seed from the parts, identical across processes (unlike hash(), which is salted)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


PROBE_SPECIAL_TOKENS = 3
"""Token ids the probe tasks reserve (separator, query, noise) before their symbols: vocabulary = 3 + num_symbols."""
