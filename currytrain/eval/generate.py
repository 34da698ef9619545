"""Generation: new tokens one at a time from a prompt, greedy or sampled, with a KV cache where the model
offers one (its decode(tokens, cache): model/protocol.py HasKVCache), so that each new token costs one
position's forward; a model without one runs the whole sequence for every token (said once per class).

Sampling follows transformers' order: temperature, then top-k, then top-p (nucleus) on what remains; a
temperature of 0 is greedy. A seed fixes the draws: the same prompt, settings and seed give the same text.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from currytrain.model.cache import KVCache
from currytrain.model.protocol import HasKVCache, full, hook

log = logging.getLogger(__name__)

_said_uncached: set[type] = set()


@dataclass(frozen=True)
class Sampling:
    """How each new token is chosen, and when generation stops."""

    max_new_tokens: int = 64
    """Tokens to generate at most (fewer when a stop token comes first or the context is full)."""
    temperature: float = 0.0
    """Divides the logits before sampling; 0 is greedy (the most likely token, no draw)."""
    top_k: int = 0
    """Sample among the k most likely tokens only; 0 keeps every token."""
    top_p: float = 1.0
    """Sample among the most likely tokens whose probabilities sum to at least p (nucleus); 1 keeps every token."""
    seed: int = 0
    """Seeds the draws (unused when greedy)."""

    def problems(self, prefix: str = "--") -> list[str]:
        """What is wrong with these settings, each with the fix (prefix: how a setting is named to the user)."""
        problems = []
        if self.max_new_tokens < 1:
            problems.append(f"{prefix}max-new-tokens={self.max_new_tokens}: pass a count of at least 1")
        if self.temperature < 0:
            problems.append(f"{prefix}temperature={self.temperature}: pass 0 (greedy) or a positive temperature such as 0.8")
        if self.top_k < 0:
            problems.append(f"{prefix}top-k={self.top_k}: pass 0 (every token) or a positive count such as 50")
        if not 0 < self.top_p <= 1:
            problems.append(f"{prefix}top-p={self.top_p}: pass a probability in (0, 1], e.g. 0.9 (1 keeps every token)")
        return problems


def choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """The next token of each row of `logits` (batch, vocab): argmax when greedy, else a draw from the tempered,
    top-k and top-p filtered distribution."""
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1:
        ordered, order = logits.sort(dim=-1, descending=True)
        before = ordered.softmax(dim=-1).cumsum(dim=-1) - ordered.softmax(dim=-1)  # mass of the tokens ranked above
        ordered = ordered.masked_fill(before >= sampling.top_p, float("-inf"))  # the first token always stays
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


def new_token_budget(prompt_length: int, sampling: Sampling, context: int | None) -> int:
    """New tokens that fit: max_new_tokens, fewer when the context ends first."""
    if context is None:
        return sampling.max_new_tokens
    return max(0, min(sampling.max_new_tokens, context - prompt_length))


def is_cached(model: nn.Module) -> bool:
    """Whether the model generates with a KV cache; says once per model class when it does not."""
    if hook(model, HasKVCache) is not None:
        return True
    if type(model) not in _said_uncached:
        _said_uncached.add(type(model))
        log.warning("%s has no decode(tokens, cache) (model/protocol.py HasKVCache): each new token runs the whole sequence again", type(model).__name__)
    return False


@torch.no_grad()
def generate(
    model: nn.Module, prompt: Sequence[int], sampling: Sampling, *, context: int | None = None, stop_ids: frozenset[int] = frozenset()
) -> Iterator[int]:
    """The new tokens after `prompt` (token ids), one at a time as each is chosen. Stops after a stop id (which
    is yielded), after max_new_tokens, or where the sequence would pass `context` tokens. A caller may stop
    early (a stop string): the generator then does no more work."""
    if not prompt:
        raise ValueError("generation needs a prompt of at least one token")
    budget = new_token_budget(len(prompt), sampling, context)
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(sampling.seed) if sampling.temperature > 0 else None
    tokens = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    cache = KVCache(len(prompt) + budget) if is_cached(model) else None
    logits = _next_logits(model, tokens, cache)
    for index in range(budget):
        token = choose(logits, sampling, generator)
        yield int(token.item())
        if int(token.item()) in stop_ids or index == budget - 1:
            return
        if cache is None:
            tokens = torch.cat([tokens, token.view(1, 1)], dim=1)
            logits = _next_logits(model, tokens, None)
        else:
            logits = _next_logits(model, token.view(1, 1), cache)


def _next_logits(model: nn.Module, tokens: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
    """The logits (1, vocab) after `tokens`: through the cache (the new tokens only) or the whole sequence."""
    logits = model.decode(tokens, cache) if cache is not None else model(tokens)
    return full(logits)[:, -1].float()
