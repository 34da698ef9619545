"""Median optimizer-step time of model=moe against model=gqa (the baseline), measured in the same process.

    python bench/moe_step_time.py                          # debug size, trainer.batch_size=32, seq 128
    python bench/moe_step_time.py --steps 20 --threads 1 -- model.capacity_factor=1.25
    python bench/moe_step_time.py --compile                # also moe with its forward and loss compiled (one graph)

Extra arguments are Hydra overrides applied to the MoE config only (the GQA baseline stays at its defaults,
apart from the shared size and data overrides in --common). Steps of the two models alternate, so load
from other processes on a shared machine slows both alike; the ratio is the figure to read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing it

from currytrain.benchmark import alternating_step_times, build_step_setup, run_accumulated_step  # noqa: E402
from currytrain.config import compose_config  # noqa: E402
from currytrain.model.protocol import causal_lm_loss  # noqa: E402
from currytrain.parallel.compile import compile_forward_loss  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="measured steps per model")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps per model first")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per step")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 keeps torch's default")
    parser.add_argument("--common", nargs="*", default=["model/size=debug", "data=synthetic"], help="overrides for both models")
    parser.add_argument("--compile", action="store_true", help="also the MoE model's forward and loss compiled (the warm-up compiles)")
    parser.add_argument("moe_overrides", nargs="*", help="Hydra overrides for the MoE model only")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    setups = {
        "gqa": build_step_setup(compose_config(["model=gqa", *args.common])),
        "moe": build_step_setup(compose_config(["model=moe", *args.common, *args.moe_overrides])),
    }

    def step_of(setup, forward_loss=None):
        # Batches are cut before timing.
        batches = [[setup.data.batch("train", step, 0, args.batch_size)] for step in range(args.warmup + args.steps)]
        return lambda step: run_accumulated_step(setup.model, setup.optimizer, batches[step], grad_clip=1.0, forward_loss=forward_loss)

    contenders = {name: step_of(setup) for name, setup in setups.items()}
    if args.compile:
        setups["moe+compile"] = compiled = build_step_setup(compose_config(["model=moe", *args.common, *args.moe_overrides]))
        contenders["moe+compile"] = step_of(compiled, compile_forward_loss(compiled.model, causal_lm_loss))
    times = alternating_step_times(contenders, rounds=args.steps, warmup=args.warmup)

    seq_len = setups["moe"].cfg.data.seq_len
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch_size} x seq {seq_len}")
    medians = {}
    for name, setup in setups.items():
        medians[name] = statistics.median(times[name])
        num_params = sum(p.numel() for p in setup.model.parameters())
        print(f"{name}: {num_params / 1e6:.2f}M params, median step {medians[name] * 1e3:.1f} ms over {args.steps} steps")
    print(f"moe / gqa step time: {medians['moe'] / medians['gqa']:.2f}x")
    if args.compile:
        ratios = sorted(c / e for c, e in zip(times["moe+compile"], times["moe"]))
        print(f"moe+compile / moe step time: {medians['moe+compile'] / medians['moe']:.2f}x (per round: {ratios[0]:.2f}-{ratios[-1]:.2f})")


if __name__ == "__main__":
    main()
