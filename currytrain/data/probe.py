"""data=probe: synthetic tasks that need one mechanism each, as next-token batches any model can train on.

Every sequence is generated from (seed, split, step, microbatch), so batches are deterministic and the
splits never share a sequence by construction of their seeds. Targets are -100 (ignored by the
cross-entropy) everywhere but at the answer positions, so the loss and the accuracy measure the task only.
Token ids: 0 is the separator, 1 the query marker, 2 the noise token, symbols are 3 .. 3+num_symbols-1.

  copy            x_1..x_k SEP x_1..x_k            answer: the second copy (needs attention to position i-k-1)
  recall          k_1 v_1 .. k_n v_n QUERY k_i v_i answer: v_i (associative recall)
  induction       x_1..x_k NOISE.. x_1..x_k          answer: the repeat after its first token (an induction head: after
                  (distinct x, random k and gap)   x_i, what followed x_i before; the random gap rules out an offset)
  parity          b_1..b_n SEP p                   answer: the parity of the bits (symbols 3 and 4)
  selective_copy  data tokens among noise, SEP, the data tokens in order   answer: the data tokens
"""

from __future__ import annotations

import torch

from currytrain.data.base import PROBE_SPECIAL_TOKENS, stable_seed

SEP, QUERY, NOISE = 0, 1, 2
FIRST_SYMBOL = PROBE_SPECIAL_TOKENS
IGNORE = -100
"""Target of the positions that are not answers (torch's cross_entropy ignore_index)."""
TASKS = ("copy", "recall", "induction", "parity", "selective_copy")


def _copy(g: torch.Generator, length: int, symbols: int) -> tuple[torch.Tensor, torch.Tensor]:
    k = (length - 1) // 2
    x = torch.randint(symbols, (k,), generator=g) + FIRST_SYMBOL
    seq = torch.cat([x, torch.tensor([SEP]), x])
    answers = torch.zeros(len(seq), dtype=torch.bool)
    answers[k + 1 :] = True
    return seq, answers


def _recall(g: torch.Generator, length: int, symbols: int) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = min((length - 3) // 2, symbols // 2)
    keys = torch.randperm(symbols, generator=g)[:pairs] + FIRST_SYMBOL
    values = torch.randint(symbols, (pairs,), generator=g) + FIRST_SYMBOL
    asked = int(torch.randint(pairs, (1,), generator=g))
    seq = torch.cat([torch.stack([keys, values], 1).flatten(), torch.tensor([QUERY, int(keys[asked]), int(values[asked])])])
    answers = torch.zeros(len(seq), dtype=torch.bool)
    answers[-1] = True
    return seq, answers


def _induction(g: torch.Generator, length: int, symbols: int) -> tuple[torch.Tensor, torch.Tensor]:
    most = max(2, min(symbols, length // 2))
    k = int(torch.randint(min(max(2, length // 4), most), most + 1, (1,), generator=g))
    segment = torch.randperm(symbols, generator=g)[:k] + FIRST_SYMBOL  # distinct: each token says where it was
    gap = int(torch.randint(length - 2 * k + 1, (1,), generator=g))  # random offset: no positional shortcut
    seq = torch.cat([torch.full((length - 2 * k - gap,), NOISE), segment, torch.full((gap,), NOISE), segment])
    answers = torch.zeros(len(seq), dtype=torch.bool)
    answers[len(seq) - k + 1 :] = True  # the repeat after its first token: what followed this token before
    return seq, answers


def _parity(g: torch.Generator, length: int, symbols: int) -> tuple[torch.Tensor, torch.Tensor]:
    bits = torch.randint(2, (length - 2,), generator=g)
    seq = torch.cat([bits + FIRST_SYMBOL, torch.tensor([SEP, FIRST_SYMBOL + int(bits.sum()) % 2])])
    answers = torch.zeros(len(seq), dtype=torch.bool)
    answers[-1] = True
    return seq, answers


def _selective_copy(g: torch.Generator, length: int, symbols: int) -> tuple[torch.Tensor, torch.Tensor]:
    k = max(1, (length - 1) // 4)
    spread = length - 1 - k
    data = torch.randint(symbols, (k,), generator=g) + FIRST_SYMBOL
    first = torch.full((spread,), NOISE)
    first[torch.randperm(spread, generator=g)[:k].sort().values] = data
    seq = torch.cat([first, torch.tensor([SEP]), data])
    answers = torch.zeros(len(seq), dtype=torch.bool)
    answers[spread + 1 :] = True
    return seq, answers


GENERATORS = {"copy": _copy, "recall": _recall, "induction": _induction, "parity": _parity, "selective_copy": _selective_copy}


class ProbeTasks:
    """Batches of one probe task: inputs (batch, seq_len) and targets (batch, seq_len), IGNORE off the answers."""

    def __init__(self, task: str, seq_len: int, num_symbols: int = 16, seed: int = 0):
        if task not in GENERATORS:
            raise ValueError(f"data.task={task} is not one of {list(TASKS)}")
        self.task, self.seq_len, self.num_symbols, self.seed = task, seq_len, num_symbols, seed
        self.vocab_size = FIRST_SYMBOL + num_symbols

    @property
    def chance(self) -> float:
        """Accuracy of a uniform guess among the answers' possible symbols."""
        return 0.5 if self.task == "parity" else 1 / self.num_symbols

    def sequence(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One example of seq_len + 1 tokens, left-padded with NOISE, and its answer mask."""
        seq, answers = GENERATORS[self.task](g, self.seq_len + 1, self.num_symbols)
        pad = self.seq_len + 1 - len(seq)
        return torch.cat([torch.full((pad,), NOISE), seq]), torch.cat([torch.zeros(pad, dtype=torch.bool), answers])

    def batch(self, split: str, step: int, micro: int, batch_size: int, rank: int = 0, num_ranks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        share = batch_size // num_ranks
        g = torch.Generator().manual_seed(stable_seed(self.seed, "probe", self.task, split, step, micro, rank))
        rows = [self.sequence(g) for _ in range(share)]
        seqs = torch.stack([seq for seq, _ in rows]).long()
        answers = torch.stack([mask for _, mask in rows])
        targets = seqs[:, 1:].masked_fill(~answers[:, 1:], IGNORE)
        return seqs[:, :-1], targets

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The task's own loss (currytrain.model.protocol: a data adapter's loss comes first): the cross-entropy
        of the answers alone, whatever loss or ignore index the model brings. Its mean is over the targets that are
        not IGNORE, the ignore index a step counts by (-100): one number says it exactly."""
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)

    def describe(self) -> dict:
        return {"task": self.task, "seq_len": self.seq_len, "num_symbols": self.num_symbols, "vocab_size": self.vocab_size, "chance": self.chance}


@torch.no_grad()
def accuracy(model: torch.nn.Module, data: ProbeTasks, batches: int, batch_size: int, device: torch.device | str = "cpu") -> float:
    """Share of answer tokens the model's argmax gets right on val batches (eval mode, restored after)."""
    training = model.training
    model.eval()
    right = total = 0
    try:
        for index in range(batches):
            inputs, targets = data.batch("val", index, 0, batch_size)
            inputs, targets = inputs.to(device), targets.to(device)
            predicted = model(inputs).argmax(-1)
            answers = targets != IGNORE
            right += int((predicted[answers] == targets[answers]).sum())
            total += int(answers.sum())
    finally:
        model.train(training)
    return right / max(1, total)
