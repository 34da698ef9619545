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
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from currytrain.build import build  # noqa: E402
from currytrain.config import register_configs  # noqa: E402
from currytrain.model import build_model  # noqa: E402
from currytrain.trainer.step import run_accumulated_step  # noqa: E402

MODELS = ("gqa", "spiking")


def compose(model: str, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=[f"model={model}", *overrides])


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
    register_configs()

    runs = {}
    for name in MODELS:
        own = args.spiking.split() if name == "spiking" else []
        cfg = compose(name, [*args.overrides, *own])
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model)
        optimizer = build(cfg.optimizer, exclude=["schedule"], model=model)
        tokens = torch.randint(0, cfg.model.vocab_size, (args.batch_size, cfg.data.seq_len + 1))
        batch = [(tokens[:, :-1], tokens[:, 1:])]
        for _ in range(args.warmup):
            run_accumulated_step(model, optimizer, batch)
        num_params = sum(p.numel() for p in model.parameters())
        runs[name] = (model, optimizer, batch, num_params, [])

    for _ in range(args.rounds):
        for name, (model, optimizer, batch, _, times) in runs.items():
            for _ in range(args.steps):
                tic = time.perf_counter()
                run_accumulated_step(model, optimizer, batch)
                times.append(time.perf_counter() - tic)

    medians = {name: statistics.median(run[4]) for name, run in runs.items()}
    tokens_per_step = args.batch_size * cfg.data.seq_len
    print(f"batch {args.batch_size} x {cfg.data.seq_len} tokens, {args.threads} thread(s), {args.rounds * args.steps} timed steps each")
    for name, (_, _, _, num_params, times) in runs.items():
        print(
            f"model={name:8s} {num_params / 1e6:6.3f}M params  median step {medians[name] * 1e3:8.1f} ms"
            f"  (min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f})  {tokens_per_step / medians[name]:9.0f} tokens/s"
        )
    print(f"ratio spiking/gqa: {medians['spiking'] / medians['gqa']:.2f}x")


if __name__ == "__main__":
    main()
