"""Per-rank bytes of parameters, gradients and optimizer state under each data-parallel strategy, 2 workers.

    python bench/dp_memory.py                       # 8-layer debug GQA, AdamW
    python bench/dp_memory.py model/size=tiny       # any Hydra override of launch.py

Each strategy is a real `launch.py parallel=<s> parallel.nproc=2` run of 2 steps; the trainer measures the
live tensors after its first step (sharded tensors count only this rank's part) and journals them per rank
(the `memory` event). Printed: the larger rank's bytes, and its ratio to ddp measured in the same run.
"""

from __future__ import annotations

import sys

from dp_launch import launch_run

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
DEFAULTS = [
    "model.n_layers=8",
    "trainer.batch_size=8",
    "trainer.max_steps=2",
    "trainer.eval_batches=1",
    "optimizer.schedule.warmup_steps=1",
    "trainer.device=cpu",
]
KINDS = ("params", "grads", "optimizer")


def main(overrides: list[str]) -> None:
    worst = {}
    for name in STRATEGIES:
        events = launch_run([*DEFAULTS, *overrides, f"parallel={name}", "parallel.nproc=2"])
        ranks = next(event["ranks"] for event in events if event["type"] == "memory")
        worst[name] = {kind: max(rank[kind] for rank in ranks) for kind in KINDS}
    print(f"per-rank bytes at 2 workers (max over ranks), ratio to ddp | overrides: {' '.join(overrides) or '(none)'}")
    print(f"{'strategy':<8}" + "".join(f"{kind:>22}" for kind in KINDS))
    for name, row in worst.items():
        cells = "".join(f"{row[kind] / 2**20:>12.2f} MiB {row[kind] / worst['ddp'][kind]:>5.2f}x" for kind in KINDS)
        print(f"{name:<8}{cells}")


if __name__ == "__main__":
    main(sys.argv[1:])
