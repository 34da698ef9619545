"""Crafted artifacts for tests/security/: each would, if anything read it the unsafe way, create a marker file
(os.mkdir of a path the test names, or builtins.open of it), which is all a test then needs to prove that nothing
ran. Nothing here is harmful beyond that file."""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

from currytrain.weights import MARKER, file_digests


def _unicode(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data if len(data) < 256 else b"X" + struct.pack("<I", len(data)) + data


def _call(module: str, name: str, argument: str, *, memo: bool = False) -> bytes:
    """Protocol 4: STACK_GLOBAL(module, name) applied to (argument,)."""
    body = _unicode(module) + (b"\x94" if memo else b"") + _unicode(name) + (b"\x94" if memo else b"")
    return b"\x80\x04" + body + b"\x93" + _unicode(argument) + b"\x85R."


class Mkdir:
    """Pickles (by __reduce__, as pickle.dumps writes it) to a call of os.mkdir."""

    def __init__(self, target: Path):
        self.target = str(target)

    def __reduce__(self):
        return (os.mkdir, (self.target,))


def pickle_tricks(marker: Path) -> dict[str, bytes]:
    """One pickle per way of reaching a callable that checkpoint metadata never holds, each calling os.mkdir(marker)."""
    target = str(marker)
    return {
        # the plain way: pickle.dumps of an object whose __reduce__ names os.mkdir (GLOBAL posix mkdir)
        "reduce to os.mkdir": pickle.dumps(Mkdir(marker), protocol=2),
        # protocol 4 resolves dotted names through attributes: an allowed module that imports os hands out os.mkdir
        "dotted name in an allowed module": _call("torch.distributed.checkpoint.metadata", "os.mkdir", target),
        "dotted name in torch": _call("torch", "os.mkdir", target),
        # the names come back from the memo rather than being pushed right before STACK_GLOBAL
        "names from the memo": b"\x80\x04" + _unicode("os") + b"\x94" + _unicode("mkdir") + b"\x94" + b"h\x00h\x01\x93" + _unicode(target) + b"\x85R.",
        # INST (protocol 0) names its class inline, as GLOBAL does
        "INST opcode": b"(" + b"S'" + target.encode() + b"'\n" + b"ios\nmkdir\n.",
        # copyreg's extension registry fetches a callable by number, never naming it
        "extension code": b"\x80\x02\x82\x01" + b"X" + struct.pack("<I", len(target)) + target.encode() + b"\x85R.",
        # a builtin that reaches anything: getattr(module, name)
        "builtins.getattr": _call("builtins", "getattr", target),
        # an allowed name whose real object is wider than the pickle needs: torch.serialization._get_layout
        "allowed helper asked for a non-layout": _call("torch.serialization", "_get_layout", "load"),
    }


def reseal(step_dir: Path) -> None:
    """Rewrite a checkpoint's manifest so that every checksum matches its files again: checksums are not signatures."""
    marker = json.loads((step_dir / MARKER).read_text())
    (step_dir / MARKER).write_text(json.dumps({**marker, "files": file_digests(step_dir)}))
