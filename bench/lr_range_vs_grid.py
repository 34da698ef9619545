"""Does the lr range test (check=lr_range) suggest an lr close to the best of a grid of full runs?

    python bench/lr_range_vs_grid.py                              # debug GQA, grid 3e-3 1e-2 3e-2
    python bench/lr_range_vs_grid.py --grid 3e-3 1e-2 model=moe   # any Hydra override of launch.py

Method: the lr_range stage runs with its defaults on the composed config (its own scratch copy of the
model); then one full run (trainer.max_steps, the configured schedule) per grid lr, each a run folder
under runs/bench/lr_range_vs_grid/<time>/grid/. Printed: the suggestion, every grid run's final val loss,
the best grid lr, and suggestion / best (the issue asks for a factor of 3 at most). Wall times are printed
for information; they depend on the machine's load.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it

from currytrain.check.lr_range import LRRange, suggest  # noqa: E402
from currytrain.check.stage import StageContext  # noqa: E402
from currytrain.check.subruns import train_subrun  # noqa: E402
from currytrain.config import compose_config  # noqa: E402
from currytrain.journal import Journal  # noqa: E402
from currytrain.parallel.state import ParallelState, resolve_device  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid", nargs="+", type=float, default=[3e-3, 1e-2, 3e-2])
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = compose_config(["logger=[jsonl]", *args.overrides])
    run_dir = ROOT / "runs" / "bench" / "lr_range_vs_grid" / time.strftime("%Y-%m-%d_%H-%M-%S")
    ctx = StageContext(cfg, ParallelState(device=resolve_device(cfg.trainer.device)), run_dir, Journal(run_dir / "journal.jsonl"))
    started = time.perf_counter()
    stage = LRRange()
    result = stage.run(ctx)
    suggested = suggest(stage.sweep, stage.rule, stage.min_loss_divisor)
    print(f"lr range test ({time.perf_counter() - started:.0f} s): {result.findings[0].observed}")
    losses = {}
    for lr in args.grid:
        run = train_subrun(ctx, "grid", f"lr_{lr:g}", [f"optimizer.lr={lr}"])
        losses[lr] = run.val_loss
        print(f"  grid lr {lr:<8g} final val loss {run.val_loss:.4f}  ({run.seconds:.0f} s)")
    best = min((lr for lr in losses if losses[lr] == losses[lr]), key=losses.get)
    print(f"best grid lr {best:g} (val loss {losses[best]:.4f}); suggested {suggested:.3g}; suggested / best = {suggested / best:.2f}")


if __name__ == "__main__":
    main()
