"""Median optimizer-step time of model=spiking against model=gqa, both measured in this run.

    python bench/spiking_step_time.py                       # debug size, batch 8, 1 thread
    python bench/spiking_step_time.py --threads 2 data.seq_len=64
    python bench/spiking_step_time.py --spiking "model.timesteps=2 model.reset=hard"

Both models are composed from conf/ with the same overrides (trailing arguments apply to both; --spiking adds spiking-only ones), built
through currytrain.build, and stepped with the trainer's own run_accumulated_step on the same random
token batch. Rounds alternate between the two models so that load from other processes on a shared
machine hits both alike; the printed ratio is spiking / gqa.
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

MODELS = ("gqa", "spiking")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per model per round")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--spiking", default="", help="space-separated overrides for model=spiking only")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to both models")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    setups, batches = {}, {}
    for name in MODELS:
        own = args.spiking.split() if name == "spiking" else []
        setups[name] = setup = build_step_setup(compose_config([f"model={name}", *args.overrides, *own]))
        tokens = torch.randint(0, setup.cfg.model.vocab_size, (args.batch_size, setup.cfg.data.seq_len + 1))
        batches[name] = [(tokens[:, :-1], tokens[:, 1:])]
        for _ in range(args.warmup):
            run_accumulated_step(setup.model, setup.optimizer, batches[name])

    def step_of(name):
        return lambda step: run_accumulated_step(setups[name].model, setups[name].optimizer, batches[name])

    times = alternating_step_times({name: step_of(name) for name in MODELS}, rounds=args.rounds, per_round=args.steps)

    medians = {name: statistics.median(values) for name, values in times.items()}
    seq_len = setups["spiking"].cfg.data.seq_len
    tokens_per_step = args.batch_size * seq_len
    print(f"batch {args.batch_size} x {seq_len} tokens, {args.threads} thread(s), {args.rounds * args.steps} timed steps each")
    for name, setup in setups.items():
        num_params = sum(p.numel() for p in setup.model.parameters())
        print(
            f"model={name:8s} {num_params / 1e6:6.3f}M params  median step {medians[name] * 1e3:8.1f} ms"
            f"  (min {min(times[name]) * 1e3:.1f}, max {max(times[name]) * 1e3:.1f})  {tokens_per_step / medians[name]:9.0f} tokens/s"
        )
    print(f"ratio spiking/gqa: {medians['spiking'] / medians['gqa']:.2f}x")


if __name__ == "__main__":
    main()
