"""The key/value cache of generation: what a decoder keeps of the tokens it has seen, so that each new token
costs one position's forward instead of the whole sequence's.

A KVCache holds, for every attention layer, the rotated keys and the values of the positions seen so far, in
buffers of a fixed capacity allocated at the first write (their shape is the layer's own: under tensor
parallelism a rank holds its heads only). A decoder's decode(tokens, cache) (model/protocol.py: HasKVCache)
runs the new tokens at positions cache.length, cache.length + 1, ... and advances the cache by their number.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of up to `capacity` positions for each layer, filled from position 0."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"a KV cache holds at least one position, not {capacity}")
        self.capacity = capacity
        self.length = 0
        """Positions written so far: the position of the next token."""
        self._layers: dict[int, LayerCache] = {}
        self._tokens: torch.Tensor | None = None

    def layer(self, index: int) -> LayerCache:
        """The cache of layer `index` (made at its first use)."""
        if index not in self._layers:
            self._layers[index] = LayerCache(self)
        return self._layers[index]

    def advance(self, tokens: torch.Tensor) -> None:
        """Count the new positions of `tokens` (batch, new) as written (every layer has written them), and keep
        their ids (a decoder that must recompute its keys reads them: seen())."""
        start, new = self.length, tokens.shape[1]
        if start + new > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; {start} + {new} do not fit")
        if self._tokens is None:
            self._tokens = tokens.new_zeros(tokens.shape[0], self.capacity)
        self._tokens[:, start : start + new] = tokens
        self.length += new

    def seen(self) -> torch.Tensor:
        """The token ids of the positions written so far (batch, length)."""
        assert self._tokens is not None, "nothing was written to this cache"
        return self._tokens[:, : self.length]

    def clear(self) -> None:
        """Forget every position (the buffers stay allocated): the next decode starts at position 0."""
        self.length = 0


class LayerCache:
    """One layer's keys and values: (batch, heads, capacity, width) buffers, the first `length` positions valid."""

    def __init__(self, owner: KVCache):
        self.owner = owner
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions' keys and values (batch, heads, new, width) after those seen, and return every
        position's (batch, heads, seen + new, width)."""
        start, new = self.owner.length, keys.shape[-2]
        if start + new > self.owner.capacity:
            raise ValueError(f"the KV cache holds {self.owner.capacity} positions; {start} + {new} do not fit")
        if self.keys is None:
            self.keys = keys.new_zeros(*keys.shape[:-2], self.owner.capacity, keys.shape[-1])
            self.values = values.new_zeros(*values.shape[:-2], self.owner.capacity, values.shape[-1])
        self.keys[..., start : start + new, :] = keys
        self.values[..., start : start + new, :] = values
        return self.keys[..., : start + new, :], self.values[..., : start + new, :]
