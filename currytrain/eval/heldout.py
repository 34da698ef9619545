"""A held-out text set (eval.texts): its token-weighted loss and bits per byte under the model.

Each document (a file, or a record of a .jsonl/.parquet file) is read with the run's tokenizer and starts from the
codec's document start (its EOS, or a newline for bytes), so every one of its tokens is scored and the start ids,
which are no text, are not. The documents are joined into one stream, cut into windows of the context (the next
window starts where the last one's targets end: each token is scored once), and the windows shared out over the
data-parallel ranks. The loss is the sum of every
scored token's loss over all ranks divided by the number of scored tokens, never a mean of per-batch means; bits
per byte is that sum in bits over the UTF-8 bytes of the text scored, comparable across tokenizers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from currytrain.eval.live import LiveModel
from currytrain.eval.tasks_local import text_files
from currytrain.eval.text import Codec


@dataclass
class TextSet:
    """A text set read and tokenized once (at the run's start): the scored stream and the bytes it holds."""

    name: str
    tokens: torch.Tensor
    """The stream: each document's start id, then its tokens."""
    starts: torch.Tensor
    """True at the stream's document-start ids: no text, so never a scored target."""
    num_bytes: int
    """UTF-8 bytes of the documents the stream holds (what bits_per_byte divides by)."""

    @classmethod
    def read(cls, name: str, location: str, codec: Codec, max_tokens: int) -> TextSet:
        from currytrain.data.readers import read_documents

        start = codec.prefix_id if codec.prefix_id is not None else 0
        stream: list[int] = []
        starts: list[int] = []
        num_bytes = 0
        for document in read_documents(text_files(location), "file"):
            ids = codec.encode(document)
            if max_tokens and len(stream) + 1 + len(ids) > max_tokens:
                ids = ids[: max(0, max_tokens - len(stream) - 1)]
                document = codec.decode(ids)  # the bytes of what is kept
                if not ids:
                    break
            starts.append(len(stream))
            stream += [start, *ids]
            num_bytes += len(document.encode("utf-8"))
            if max_tokens and len(stream) >= max_tokens:
                break
        marks = torch.zeros(len(stream), dtype=torch.bool)
        marks[starts] = True
        return cls(name, torch.tensor(stream, dtype=torch.long), marks, num_bytes)

    def windows(self, context: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(tokens, targets scored) of windows overlapping by one token: window i holds tokens [i * context,
        (i + 1) * context] (its last is shorter), and scores the targets that are text, not a document's start."""
        last = len(self.tokens) - 1
        spans = [(start, min(start + context, last) + 1) for start in range(0, last, context)]
        return [(self.tokens[begin:end], ~self.starts[begin + 1 : end]) for begin, end in spans]

    def evaluate(self, live: LiveModel, batch_size: int) -> dict[str, float]:
        """eval/<name>/loss (nats per token), bits_per_byte and tokens, over every rank's share of the windows."""
        windows = self.windows(live.context or len(self.tokens))
        rank, ranks = live.state.dp_rank, live.state.dp_size
        mine = windows[rank::ranks]
        batches = [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]
        totals = torch.zeros(2, dtype=torch.float64, device=live.device)  # (sum of token losses, scored tokens)
        for batch, real in live.in_step(batches):
            if batch is None:  # no window for this rank at all: a one-token forward keeps it in step
                live.logits(torch.zeros(1, 1, dtype=torch.long))
                continue
            total, count = self._batch_loss(live, batch)
            if real:
                totals += torch.stack([total.double(), count.double()])
        total, count = live.sum_over_ranks(totals).tolist()
        loss = total / count if count else math.nan
        return {"loss": loss, "bits_per_byte": total / math.log(2) / self.num_bytes if self.num_bytes else math.nan, "tokens": count}

    @staticmethod
    def _batch_loss(live: LiveModel, windows: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of the token losses, number of targets) of a batch of windows, right-padded to the longest."""
        length = max(len(tokens) for tokens, _ in windows) - 1
        inputs = torch.zeros(len(windows), length, dtype=torch.long)
        targets = torch.full((len(windows), length), -100, dtype=torch.long)
        for row, (tokens, scored) in enumerate(windows):
            inputs[row, : len(tokens) - 1] = tokens[:-1]
            targets[row, : len(tokens) - 1] = tokens[1:].masked_fill(~scored, -100)
        logits = live.logits(inputs)
        targets = targets.to(logits.device)
        total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100, reduction="sum")
        return total, (targets != -100).sum()


def read_text_sets(texts: dict[str, str], codec: Codec, max_tokens: int) -> list[TextSet]:
    from currytrain.errors import ConfigError

    sets = []
    for name, location in dict(texts).items():
        try:
            sets.append(TextSet.read(name, str(Path(str(location)).expanduser()), codec, max_tokens))
        except ConfigError as error:  # the corpus readers name data.paths, the key of a run's corpus, not this one
            raise ConfigError(str(error).replace("data.paths", f"eval.texts.{name}")) from None
    return sets
