"""Benchmark: the step time of a run that logs every step with every logger on, against the same run logging to
jsonl only, in one process.

    python bench/logger_load.py                          # the default (debug) model, 9 rounds of 50 steps each
    python bench/logger_load.py model/size=tiny --steps 100 --rounds 5 --json out.json

Two Trainers of the same config (trainer.log_every=1), one with logger=[jsonl], one with
logger=[tensorboard,jsonl,mlflow,wandb] (W&B offline, MLflow on SQLite), train in alternating blocks of --steps
steps, so that machine noise hits both alike; each block's time includes the journal's metrics line of every
step, and the last block of each ends with closing its loggers (what they still had queued is written then).
Prints the median ms/step of each and their ratio (all loggers / jsonl only); the target is <= 1.10. It also
prints the CPU time per step (this process, its logging thread included, and its child processes: W&B's service),
which a busy shared machine disturbs far less than the wall clock. `make reliability` runs it and
docs/reliability.md shows the result.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing it

from currytrain.config import compose_config  # noqa: E402
from currytrain.trainer.trainer import Trainer  # noqa: E402

ALL = "[tensorboard,jsonl,mlflow,wandb]"
BASELINE = "[jsonl]"


def measure(overrides: list[str], steps: int, rounds: int, warmup: int) -> dict:
    common = ["trainer.log_every=1", "trainer.eval_every=1000000", "trainer.progress=false", "trainer.max_steps=1000000", "data.max_bytes=300000"]
    with tempfile.TemporaryDirectory() as folder:
        trainers = {
            name: Trainer(compose_config([*common, *overrides, f"logger={loggers}"]), Path(folder) / name)
            for name, loggers in (("jsonl", BASELINE), ("all", ALL))
        }
        for trainer in trainers.values():
            trainer.journal.event("start", step=0)
            for _ in range(warmup):
                trainer.train_step()
        seconds: dict[str, list[float]] = {name: [] for name in trainers}
        cpu: dict[str, list[float]] = {name: [] for name in trainers}
        closing = {}
        for round_ in range(rounds):
            order = list(trainers) if round_ % 2 == 0 else list(trainers)[::-1]
            for name in order:
                started, used = time.perf_counter(), cpu_seconds()
                for _ in range(steps):
                    trainers[name].train_step()
                if round_ == rounds - 1:  # the last block pays for what the loggers still hold
                    closed = time.perf_counter()
                    trainers[name].loggers.close("finished")
                    closing[name] = time.perf_counter() - closed
                seconds[name].append((time.perf_counter() - started) / steps)
                cpu[name].append((cpu_seconds() - used) / steps)
        cfg = trainers["jsonl"].cfg
    ratios = [all_ / base for all_, base in zip(seconds["all"], seconds["jsonl"])]
    cpu_ratio = sum(cpu["all"]) / sum(cpu["jsonl"])
    return {
        "overrides": overrides,
        "steps_per_block": steps,
        "rounds": rounds,
        "threads": torch.get_num_threads(),
        "batch_size": cfg.batch_size,
        "jsonl_ms_per_step": round(statistics.median(seconds["jsonl"]) * 1e3, 3),
        "all_ms_per_step": round(statistics.median(seconds["all"]) * 1e3, 3),
        "ratio": round(statistics.median(ratios), 3),
        "ratios": [round(r, 3) for r in ratios],
        "close_seconds_all": round(closing["all"], 2),
        "jsonl_cpu_ms_per_step": round(sum(cpu["jsonl"]) / rounds * 1e3, 3),
        "all_cpu_ms_per_step": round(sum(cpu["all"]) / rounds * 1e3, 3),
        "cpu_ratio": round(cpu_ratio, 3),
        "load_average": round(os.getloadavg()[0], 1),
        "cpus": os.cpu_count(),
    }


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of its live children (W&B's service process, read from /proc)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():  # ppid
            children += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return own.ru_utime + own.ru_stime + children


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=9, help="blocks of each, alternating (the ratio is the median of the rounds')")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args, overrides = parser.parse_known_args()
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure(overrides, args.steps, args.rounds, args.warmup)
    print(f"jsonl only:  {result['jsonl_ms_per_step']:8.2f} ms/step")
    print(f"all loggers: {result['all_ms_per_step']:8.2f} ms/step   ({ALL}; closing them took {result['close_seconds_all']} s)")
    print(f"ratio all/jsonl: {result['ratio']:.3f} (per round {result['ratios']}; target <= 1.10; threads={result['threads']})")
    print(
        f"CPU time per step: {result['jsonl_cpu_ms_per_step']:.2f} ms jsonl only, {result['all_cpu_ms_per_step']:.2f} ms all loggers: "
        f"ratio {result['cpu_ratio']:.3f} (load average {result['load_average']} on {result['cpus']} CPUs)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
