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
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from currytrain.benchmark import run_accumulated_step  # noqa: E402
from currytrain.build import build  # noqa: E402
from currytrain.config import register_configs  # noqa: E402
from currytrain.model import build_model  # noqa: E402


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
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    torch.manual_seed(cfg.seed)
    data = build(cfg.data)
    models = {name: build_model(cfg.model) for name in ("currytrain", "plain")}
    optimizers = {name: build(cfg.optimizer, exclude=["schedule"], model=model) for name, model in models.items()}
    step_fns = {
        "currytrain": lambda model, optimizer, micro: run_accumulated_step(model, optimizer, micro, grad_clip=cfg.trainer.grad_clip),
        "plain": lambda model, optimizer, micro: plain_step(model, optimizer, micro, cfg.trainer.grad_clip),
    }
    times: dict[str, list[float]] = {name: [] for name in models}
    for step in range(args.warmup + args.steps):
        micro = [data.batch("train", step, m, cfg.trainer.batch_size) for m in range(cfg.trainer.grad_accum)]
        for name in models:
            tic = time.perf_counter()
            step_fns[name](models[name], optimizers[name], micro)
            if step >= args.warmup:
                times[name].append(time.perf_counter() - tic)
    tokens = cfg.trainer.batch_size * cfg.trainer.grad_accum * cfg.data.seq_len
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(f"{name:>10}: median {median * 1e3:8.1f} ms/step  {tokens / median:10,.0f} tok/s")
    print(f"ratio curryTrain/plain: {medians['currytrain'] / medians['plain']:.3f}  (threads={torch.get_num_threads()}, steps={args.steps})")


if __name__ == "__main__":
    main()
