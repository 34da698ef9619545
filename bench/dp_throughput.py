"""Training tokens/s of 2 ddp workers against 1 process, at the same global batch, on this machine.

    python bench/dp_throughput.py                   # debug GQA, global batch 16 x 128 tokens, 30 steps
    python bench/dp_throughput.py model/size=tiny trainer.batch_size=32

All are real `launch.py` runs: parallel=single with torch's default threads, the same with one thread
(OMP_NUM_THREADS=1), then parallel=ddp parallel.nproc=2 (each worker on cores // 2 threads). tokens/s is the global batch's tokens over rank 0's step time, as the trainer logs it;
the median over the steps after the first 5 is printed, with the ratio ddp@2 / single@1. On a machine with
2 cores shared by other work this measures contention as much as scaling: the number is what it is.
"""

from __future__ import annotations

import statistics
import sys

from dp_launch import launch_run

DEFAULTS = [
    "trainer.batch_size=16",
    "trainer.max_steps=30",
    "optimizer.schedule.warmup_steps=3",
    "trainer.eval_every=1000",
    "trainer.eval_batches=1",
    "trainer.log_every=1",
    "trainer.device=cpu",
]
# name -> (overrides, environment). single@1 uses torch's default threads (all cores); single@1x1 one thread,
# which shows how much of a difference comes from intra-op threading rather than from data parallelism.
SETUPS = {
    "single@1": (["parallel=single"], {}),
    "single@1x1": (["parallel=single"], {"OMP_NUM_THREADS": "1"}),
    "ddp@2": (["parallel=ddp", "parallel.nproc=2"], {}),
}


def tokens_per_s(events: list[dict]) -> float:
    rates = [event["train/tokens_per_s"] for event in events if event["type"] == "metrics" and event["step"] > 5]
    return statistics.median(rates)


def main(overrides: list[str]) -> None:
    rates = {name: tokens_per_s(launch_run([*DEFAULTS, *overrides, *setup], env)) for name, (setup, env) in SETUPS.items()}
    print(f"training tokens/s, median of steps 6+ | overrides: {' '.join(overrides) or '(none)'}")
    for name, rate in rates.items():
        print(f"{name:<11} {rate:>10.0f} tokens/s  {rate / rates['single@1']:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
