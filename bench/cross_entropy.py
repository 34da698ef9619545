"""The default loss's chunked cross-entropy (currytrain/model/loss.py) against F.cross_entropy of the upcast logits,
forward + backward, on random logits of several sizes, in turns.

    python bench/cross_entropy.py                      # fp32 and bf16, the table of docs/performance.md (~2 min)
    python bench/cross_entropy.py --dtypes bfloat16 --pairs 40

Each pair times torch's loss and the chunked one on the same logits (alternating_step_times: the first of a pair
alternates); printed per size and dtype: both medians,
their ratio (torch / chunked: above 1, the chunked loss is faster; the ratio of the medians, as bench/peers.py
takes it, not the median of the pairs' ratios, which splits in two clusters when one contender's second call
runs on the caches its first warmed), and whether the default loss (causal_lm_loss) takes the chunked path there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing it

from currytrain.benchmark import alternating_step_times  # noqa: E402
from currytrain.model.loss import chunked_cross_entropy, chunked_pays  # noqa: E402

SHAPES = [(512, 1024), (2048, 1024), (256, 8192), (512, 8192), (1024, 8192), (2048, 8192), (512, 32768), (2048, 32768), (512, 128256)]
"""(tokens, vocabulary): tiny's 512 x 1k, small's 2k x 8k, medium's 512 x 32k, and Llama 3's vocabulary."""


def loss_step(loss, logits: torch.Tensor, targets: torch.Tensor):
    """A step of alternating_step_times: the loss's forward and backward on a fresh leaf of `logits`."""
    return lambda step: loss(logits.detach().requires_grad_(), targets).backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"threads={torch.get_num_threads()}, {args.pairs} pairs after {args.warmup}\n")
    print("| logits (tokens x vocabulary) | dtype | torch ms | chunked ms | torch / chunked | default loss chunks |")
    print("|---|---|---|---|---|---|")
    for tokens, classes in SHAPES:
        for name in args.dtypes:
            logits = (torch.randn(tokens, classes) * 3).to(getattr(torch, name))
            targets = torch.randint(0, classes, (tokens,))
            times = alternating_step_times(
                {"torch": loss_step(lambda x, t: F.cross_entropy(x.float(), t), logits, targets), "chunked": loss_step(chunked_cross_entropy, logits, targets)},
                rounds=args.pairs,
                warmup=args.warmup,
            )
            torch_s, chunked_s = statistics.median(times["torch"]), statistics.median(times["chunked"])
            print(
                f"| {tokens:,} x {classes:,} | {name} | {torch_s * 1e3:.2f} | {chunked_s * 1e3:.2f} "
                f"| {torch_s / chunked_s:.2f}x | {'yes' if chunked_pays(logits, targets) else 'no'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
