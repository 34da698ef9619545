"""curryTrain's model as an lm-evaluation-harness LM: loglikelihood, loglikelihood_rolling and generate_until on the
live model (imported only when a task runs: lm-eval is an optional extra, and its import takes seconds).

Text is split into context and continuation tokens as lm-eval's own Hugging Face backend splits it (the context's
trailing spaces move to the continuation; the continuation's tokens are those of context + continuation after the
context's), so both backends score the same tokens. A request longer than the context is a ConfigError naming its
task's file (lm-eval's backend would cut its start silently). Each data-parallel rank answers the requests lm-eval
hands it (lm-eval splits the documents over `rank` and `world_size`); forwards run in step (eval/live.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from currytrain.errors import ConfigError
from currytrain.eval.generate import Sampling, choose, generate
from currytrain.eval.live import LiveModel
from currytrain.eval.text import Codec

Pair = tuple[list[int], list[int]]
"""(context tokens, continuation tokens) of one scored request."""


class CurryTrainLM(LM):
    """The lm-eval view of a LiveModel read through a Codec.

    task_files: task name -> its YAML, for messages. dry: tokenize and check lengths only, answering with
    placeholders (the check a run makes before its first step)."""

    def __init__(
        self,
        live: LiveModel,
        codec: Codec,
        *,
        batch_size: int,
        max_new_tokens: int,
        seed: int,
        task_files: dict[str, str],
        dry: bool = False,
    ):
        super().__init__()
        self.live, self.codec = live, codec
        self.batch_size, self.max_new_tokens, self.seed = batch_size, max_new_tokens, seed
        self.task_files, self.dry = task_files, dry
        self._rank, self._world_size, self._device = live.state.dp_rank, live.state.dp_size, live.device
        if codec.prefix_id is None:
            raise ConfigError(f"{codec.name} names no EOS or BOS token, which lm-eval's requests start from: pass a tokenizer with one")

    @property
    def max_length(self) -> int:
        return self.live.context or 2048

    # ------------------------------------------------------------------------------------------ lm-eval's API

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        pairs = [self._pair(*request.args) for request in requests]
        for request, pair in zip(requests, pairs):
            self._check_length(request, len(pair[0]) + len(pair[1]) - 1)
        if self.dry:
            return [(-1.0, False)] * len(requests)
        return self._score(pairs)

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        windows: list[Pair] = []
        owners: list[int] = []
        for index, request in enumerate(requests):
            tokens = self.codec.encode(request.args[0])
            for window in get_rolling_token_windows(tokens, self.codec.prefix_id, self.max_length, 1):
                windows.append(make_disjoint_window(window))
                owners.append(index)
        if self.dry:
            return [-1.0] * len(requests)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._score(windows)):
            totals[owner] += logprob
        return totals

    def generate_until(self, requests: list[Any]) -> list[str]:
        prompts = []
        for request in requests:
            context, options = request.args
            ids = self.codec.encode(context) or [self.codec.prefix_id]
            self._check_length(request, len(ids), prompt=True)
            prompts.append((ids, options))
        if self.dry:
            return [""] * len(requests)
        if not self.live.sharded:
            return [self._generate_alone(ids, options) for ids, options in prompts]
        texts = []
        for prompt, real in self.live.in_step(prompts):
            ids, options = prompt if prompt is not None else ([self.codec.prefix_id], {})
            text = self._generate_in_step(ids, options, real)
            if real:
                texts.append(text)
        return texts

    # ------------------------------------------------------------------------------------------ scoring

    def _pair(self, context: str, continuation: str) -> Pair:
        """The context's and the continuation's tokens, split as lm-eval's Hugging Face backend splits them."""
        if not context:
            return [self.codec.prefix_id], self.codec.encode(continuation)
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, head = self.codec.encode(context + continuation), self.codec.encode(context)
        if not head:  # a context of spaces alone: the continuation starts the document
            return [self.codec.prefix_id], whole
        return head, whole[len(head) :]

    def _score(self, pairs: list[Pair]) -> list[tuple[float, bool]]:
        """(log-probability of the continuation, whether greedy decoding gives it) of each pair, in batches run in step."""
        batches = [pairs[i : i + self.batch_size] for i in range(0, len(pairs), self.batch_size)]
        results: list[tuple[float, bool]] = []
        for batch, real in self.live.in_step(batches):
            if batch is None:
                self.live.logits(torch.zeros(1, 1, dtype=torch.long))
                continue
            scored = self._score_batch(batch)
            if real:
                results += scored
        return results

    def _score_batch(self, batch: list[Pair]) -> list[tuple[float, bool]]:
        sequences = [(context + continuation)[:-1] for context, continuation in batch]
        inputs = torch.zeros(len(batch), max(map(len, sequences)), dtype=torch.long)
        for row, sequence in enumerate(sequences):
            inputs[row, : len(sequence)] = torch.tensor(sequence)
        logits = self.live.logits(inputs)
        results = []
        for row, (sequence, (_, continuation)) in enumerate(zip(sequences, batch)):
            rows = logits[row, len(sequence) - len(continuation) : len(sequence)].log_softmax(dim=-1)
            target = torch.tensor(continuation, device=rows.device)
            logprob = rows.gather(-1, target[:, None]).sum().item()
            results.append((float(logprob), bool((rows.argmax(dim=-1) == target).all())))
        return results

    # ------------------------------------------------------------------------------------------ generation

    def _sampling(self, options: dict[str, Any], budget: int) -> Sampling:
        sampled = bool(options.get("do_sample", False)) and float(options.get("temperature", 1.0)) > 0
        return Sampling(
            max_new_tokens=budget,
            temperature=float(options.get("temperature", 1.0)) if sampled else 0.0,
            top_k=int(options.get("top_k") or 0),
            top_p=float(options.get("top_p") or 1.0),
            seed=self.seed,
        )

    def _budget(self, ids: list[int], options: dict[str, Any]) -> int:
        return max(1, min(int(options.get("max_gen_toks", self.max_new_tokens)), self.max_length - len(ids)))

    @staticmethod
    def _stops(options: dict[str, Any]) -> list[str]:
        until = options.get("until") or []
        return [until] if isinstance(until, str) else list(until)

    def _generate_alone(self, ids: list[int], options: dict[str, Any]) -> str:
        """One process: the model's own generation (its KV cache), stopped at the first stop string."""
        stops, stream, text = self._stops(options), self.codec.stream(), ""
        sampling = self._sampling(options, self._budget(ids, options))
        for token in generate(self.live.model, ids, sampling, context=self.max_length, stop_ids=self.codec.stop_ids):
            if token in self.codec.stop_ids:
                break
            text += stream.push(token)
            if _cut(text, stops) is not None:
                break
        text += stream.finish()
        return text[: _cut(text, stops)]

    def _generate_in_step(self, ids: list[int], options: dict[str, Any], real: bool = True) -> str:
        """Several processes: the whole sequence through the sharded forward for each new token, every rank stepping
        until all are done (a rank that is done runs its last sequence again)."""
        stops, text, stream = self._stops(options), "", self.codec.stream()
        sampling = self._sampling(options, self._budget(ids, options))
        generator = torch.Generator().manual_seed(sampling.seed) if sampling.temperature > 0 else None
        tokens, done, produced = list(ids), not real, 0
        while self.live.agree(int(not done)):
            logits = self.live.logits(torch.tensor([tokens]))[:, -1]
            if done:
                continue
            token = int(choose(logits.cpu(), sampling, generator).item())
            produced += 1
            if token in self.codec.stop_ids:
                done = True
                continue
            tokens.append(token)
            text += stream.push(token)
            done = _cut(text, stops) is not None or produced >= sampling.max_new_tokens or len(tokens) >= self.max_length
        text += stream.finish()
        return text[: _cut(text, stops)]

    # ------------------------------------------------------------------------------------------ checks

    def _check_length(self, request: Any, length: int, prompt: bool = False) -> None:
        if length < self.max_length or (not prompt and length == self.max_length):
            return
        name = getattr(request, "task_name", None) or "a task"
        where = f"{name} ({self.task_files[name]})" if name in self.task_files else name
        what = "a prompt" if prompt else "a request"
        raise ConfigError(
            f"eval.tasks: {where} has {what} of {length} tokens, and the evaluators' context is {self.max_length} tokens (eval.seq_len, "
            "else the run's data.seq_len): pass a larger eval.seq_len (at most model.max_seq_len), fewer few-shot examples (eval.num_fewshot), "
            "or shorter prompts in the task"
        )

    # lm-eval gathers request counts and per-document metrics over the data-parallel ranks.

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        group = self.live.state.view("batch")
        if group is None or group.size() == 1:
            return tensor.reshape(-1)
        parts = [torch.zeros_like(tensor.reshape(-1)) for _ in range(group.size())]
        dist.all_gather(parts, tensor.reshape(-1).contiguous(), group=group.get_group())
        return torch.cat(parts)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        group = self.live.state.view("batch")
        if group is None or group.size() == 1:
            return [obj]
        gathered: list[Any] = [None] * group.size()
        dist.all_gather_object(gathered, obj, group=group.get_group())
        return gathered if self._rank == dst else None

    def barrier(self) -> None:
        if self.live.sharded:
            dist.barrier()


def _cut(text: str, stops: list[str]) -> int | None:
    """Where the first stop string begins in `text`, or None."""
    found = [text.find(stop) for stop in stops if stop and stop in text]
    return min(found) if found else None
