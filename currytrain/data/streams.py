"""Token streams too large to hold in memory, read through memory maps, and mixtures of several streams.

A TokenCorpus's train or val stream is a 1-D tensor, or one of these: a SpanStream (one split of a sharded token
cache: runs of documents spread over shard files) or a MixedStream (several sources drawn by weight). Each draws
a batch's windows from the corpus's generator, so a batch stays a pure function of its coordinates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype a stream of `dtype` ids reads as (uint32 ids stay below 2**31: viewed as int32)."""
    return torch.int32 if dtype == np.uint32 else torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


def windows(stream: torch.Tensor | SpanStream, starts: torch.Tensor, width: int) -> torch.Tensor:
    """(len(starts), width) int64: the tokens of `stream` from each start on."""
    if isinstance(stream, torch.Tensor):
        return stream[starts[:, None] + torch.arange(width)].long()
    return stream.windows(starts, width)


class SpanStream:
    """One split of a token cache as one stream: its spans (shard, first token, end token) back to back. Shards
    are memory-mapped when first read; the OS pages in only the windows drawn."""

    def __init__(self, folder: Path, spans: np.ndarray, dtype: np.dtype):
        self.folder, self.spans, self.np_dtype = folder, spans, np.dtype(dtype)
        self.dtype = torch_dtype(self.np_dtype)
        self.offsets = np.concatenate([[0], np.cumsum(spans[:, 2] - spans[:, 1])]).astype(np.int64)
        self.maps: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def shard(self, index: int) -> np.ndarray:
        if index not in self.maps:
            path = self.folder / f"shard-{index:06d}.bin"
            self.maps[index] = np.memmap(path, dtype=self.np_dtype, mode="r") if path.stat().st_size else np.zeros(0, self.np_dtype)
        return self.maps[index]

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens [start, start + count) of the stream, across spans where a window crosses them."""
        out = np.empty(count, dtype=np.int64)
        span = int(np.searchsorted(self.offsets, start, side="right")) - 1
        filled = 0
        while filled < count:
            shard, first, end = self.spans[span]
            begin = first + start + filled - self.offsets[span]
            take = min(count - filled, end - begin)
            out[filled : filled + take] = self.shard(int(shard))[begin : begin + take]
            filled += take
            span += 1
        return out

    def windows(self, starts: torch.Tensor, width: int) -> torch.Tensor:
        return torch.from_numpy(np.stack([self.read(int(start), width) for start in starts])) if len(starts) else torch.zeros(0, width, dtype=torch.long)

    def tensor(self) -> torch.Tensor:
        """The whole stream in memory (for small streams)."""
        data = np.concatenate([self.shard(int(shard))[first:end] for shard, first, end in self.spans]) if len(self.spans) else np.zeros(0, self.np_dtype)
        return torch.from_numpy(data.view(np.int32) if data.dtype == np.uint32 else data)


class MixedStream:
    """Sources drawn by weight: each window of a batch comes from one source. The sources of a batch's windows are
    fixed by systematic sampling (a random offset, then evenly spaced picks along the cumulative weights), so every
    batch holds each source's share up to one window, then shuffled, so that every rank's slice mixes them too."""

    def __init__(self, streams: list[torch.Tensor | SpanStream], weights: list[float]):
        self.streams = streams
        total = sum(weights)
        self.bounds = torch.tensor([sum(weights[: k + 1]) / total for k in range(len(weights))], dtype=torch.float64)
        self.bounds[-1] = 1.0
        self.dtype = streams[0].dtype

    def __len__(self) -> int:
        return sum(len(stream) for stream in self.streams)

    def sources(self, generator: torch.Generator, count: int) -> torch.Tensor:
        """The source of each of `count` windows."""
        picks = (torch.rand((), generator=generator, dtype=torch.float64) + torch.arange(count, dtype=torch.float64)) / count
        return torch.searchsorted(self.bounds, picks, right=True).clamp(max=len(self.streams) - 1)[torch.randperm(count, generator=generator)]

    def draw(self, generator: torch.Generator, count: int, width: int, keep: slice) -> torch.Tensor:
        """The windows `keep` of a batch of `count` windows of `width` tokens."""
        source = self.sources(generator, count)
        room = torch.tensor([len(stream) - width for stream in self.streams], dtype=torch.float64)
        starts = (torch.rand(count, generator=generator, dtype=torch.float64) * room[source]).long()
        source, starts = source[keep], starts[keep]
        out = torch.empty(len(source), width, dtype=torch.long)
        for index, stream in enumerate(self.streams):
            rows = (source == index).nonzero().flatten()
            if len(rows):
                out[rows] = windows(stream, starts[rows], width)
        return out
