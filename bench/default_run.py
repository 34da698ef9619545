"""Is a candidate default better than today's? Runs `python launch.py` (what `make train` runs) with the
current defaults and with each candidate's overrides, taking turns, and prints each one's final val loss and
run seconds (the journal's `finish` event: training and evals, not start-up), medians over the repetitions,
and the ratios against the current default.

    .venv/bin/python bench/default_run.py --candidate "trainer.precision=bf16" --candidate "trainer.compile=true" --repeats 3

A quiet machine matters here: the runs are timed whole. `--base` adds overrides to every run (e.g. a shorter
trainer.max_steps for a smoke run of this script).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from currytrain.journal import read_journal  # noqa: E402


def run(overrides: list[str], run_dir: Path) -> tuple[float, float]:
    """(final val loss, seconds) of one launch.py run."""
    args = [sys.executable, str(ROOT / "launch.py"), *overrides, "trainer.progress=false", f"hydra.run.dir={run_dir}"]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{shlex.join(overrides)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    finish = read_journal(run_dir / "journal.jsonl")[-1]
    return finish["val_loss"], finish["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidate", action="append", default=[], help="overrides of one candidate, as one quoted string")
    parser.add_argument("--base", default="", help="overrides added to every run")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each contender, alternating (default 2)")
    args = parser.parse_args()
    contenders = {"default": []} | {f"candidate {i + 1}": shlex.split(text) for i, text in enumerate(args.candidate)}
    base = shlex.split(args.base)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            for name, overrides in contenders.items():
                results[name].append(run([*base, *overrides], Path(folder) / f"{name.replace(' ', '_')}_{repeat}"))
    reference = statistics.median(seconds for _, seconds in results["default"])
    print(f"{'contender':<14} {'val loss (median)':>18} {'seconds (median)':>17} {'time ratio':>11}  overrides")
    for name, rows in results.items():
        loss, seconds = statistics.median(loss for loss, _ in rows), statistics.median(seconds for _, seconds in rows)
        print(f"{name:<14} {loss:>18.4f} {seconds:>17.1f} {seconds / reference:>10.2f}x  {shlex.join(contenders[name]) or '(current defaults)'}")


if __name__ == "__main__":
    main()
