"""Generation's cost per new token (currytrain/eval/generate.py): with the KV cache it should not grow with the
number of tokens generated; without it (the whole sequence again for every token) it grows with the length.

    python bench/generate.py                       # model/size=small, one thread, 16 vs 256 new tokens, 5 rounds (~2 min)
    python bench/generate.py --size debug --rounds 9 --json bench.json

Each round times, in turns, a greedy generation of 16 and of 256 new tokens after an 8-token prompt, cached and
recomputed (the model without its decode()), on the same weights. Printed: the median seconds per new token of
each, and the ratio of the 256-token run's per-token time to the 16-token run's (the KV cache's promise: <= 1.3).
On a model as small as model/size=debug a CPU's per-token time is the layers' call overhead, so recomputing barely
grows either: small (16M parameters) shows the difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing it

from currytrain.config import compose_config  # noqa: E402
from currytrain.eval.generate import Sampling, generate  # noqa: E402
from currytrain.model import build_model  # noqa: E402

PROMPT = 8
LENGTHS = (16, 256)


class Recomputing(torch.nn.Module):
    """The same model without decode(): generation runs the whole sequence for every new token."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)


def seconds_per_token(model: torch.nn.Module, prompt: list[int], new_tokens: int) -> float:
    started = time.perf_counter()
    produced = sum(1 for _ in generate(model, prompt, Sampling(max_new_tokens=new_tokens)))
    assert produced == new_tokens, produced
    return (time.perf_counter() - started) / new_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", help="model/size (default small)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0: torch's own)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = compose_config([f"model/size={args.size}", f"model.max_seq_len={PROMPT + max(LENGTHS)}"])
    torch.manual_seed(0)
    model = build_model(cfg.model).eval().to(args.device)
    contenders = {"cached": model, "recomputed": Recomputing(model).eval()}
    prompt = torch.randint(0, cfg.model.vocab_size, (PROMPT,)).tolist()
    for contender in contenders.values():  # warm-up: allocator, kernels, the one-time warning
        seconds_per_token(contender, prompt, 4)
    times: dict[tuple[str, int], list[float]] = {(name, n): [] for name in contenders for n in LENGTHS}
    for _ in range(args.rounds):
        for name, contender in contenders.items():
            for n in LENGTHS:
                times[name, n].append(seconds_per_token(contender, prompt, n))
    medians = {key: statistics.median(values) for key, values in times.items()}
    print(f"model/size={args.size} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters) on {args.device}, threads={torch.get_num_threads()},")
    print(f"prompt {PROMPT} tokens, greedy, median of {args.rounds} rounds\n")
    print(f"| generation | ms/token at {LENGTHS[0]} | ms/token at {LENGTHS[1]} | ratio {LENGTHS[1]} / {LENGTHS[0]} |")
    print("|---|---|---|---|")
    result = {"size": args.size, "threads": torch.get_num_threads(), "rounds": args.rounds, "device": args.device}
    for name in contenders:
        short, long = medians[name, LENGTHS[0]], medians[name, LENGTHS[1]]
        print(f"| {name} | {short * 1e3:.2f} | {long * 1e3:.2f} | {long / short:.2f} |")
        result[name] = {"seconds_per_token": {str(n): medians[name, n] for n in LENGTHS}, "ratio": long / short}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
