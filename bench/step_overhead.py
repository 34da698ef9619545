"""Benchmark: one optimizer step through curryTrain vs a hand-written PyTorch step, same process.

    python bench/step_overhead.py                       # debug GQA, 20 timed steps each
    python bench/step_overhead.py model/size=tiny trainer.grad_accum=4 --steps 30

Prints the median step time of each and their ratio (curryTrain / plain). Both run the same
model, optimizer and batches, interleaved step by step so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing it

from currytrain.benchmark import alternating_step_times, build_step_setup, run_accumulated_step  # noqa: E402
from currytrain.config import compose_config  # noqa: E402


def plain_step(model, optimizer, microbatches, grad_clip):
    for inputs, targets in microbatches:
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()) / len(microbatches)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args, overrides = parser.parse_known_args()
    cfg = compose_config(overrides)
    trainer = cfg.trainer
    setups = {name: build_step_setup(cfg) for name in ("currytrain", "plain")}  # same seed: same weights

    # Batches are cut before timing, the same ones for both.
    data = setups["currytrain"].data
    batches = [[data.batch("train", step, m, trainer.batch_size) for m in range(trainer.grad_accum)] for step in range(args.warmup + args.steps)]
    ours, plain = setups["currytrain"], setups["plain"]
    times = alternating_step_times(
        {
            "currytrain": lambda step: run_accumulated_step(ours.model, ours.optimizer, batches[step], grad_clip=trainer.grad_clip),
            "plain": lambda step: plain_step(plain.model, plain.optimizer, batches[step], trainer.grad_clip),
        },
        rounds=args.steps,
        warmup=args.warmup,
    )
    tokens = trainer.batch_size * trainer.grad_accum * cfg.data.seq_len
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(f"{name:>10}: median {median * 1e3:8.1f} ms/step  {tokens / median:10,.0f} tok/s")
    print(f"ratio curryTrain/plain: {medians['currytrain'] / medians['plain']:.3f}  (threads={torch.get_num_threads()}, steps={args.steps})")


if __name__ == "__main__":
    main()
