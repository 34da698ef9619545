"""The cold first compiled step of a model (model=moe by default) and its compiled against eager step time, for
this checkout and, with --baseline, for another git revision of it, or with --env, under inductor settings, in turns.

    python bench/moe_compile.py                          # this checkout: eager, then compiled cold, 2 rounds
    python bench/moe_compile.py --baseline main          # also `main` (git archive to a temporary folder), in turns
    python bench/moe_compile.py --rounds 3 -- model=gqa  # another model (Hydra overrides after --)
    python bench/moe_compile.py --no-eager --env TORCHINDUCTOR_COMPILE_THREADS=1 -- model=gqa   # an inductor option

Each run is `python launch.py <TINY dims> model.n_layers=2 trainer.max_steps=STEPS ...` in a fresh process and a
fresh run folder and a fresh trainer.compile_cache, so the compile cache starts empty: the first step pays the whole
compilation. Read back from the run: the journal's `compile` event (first step seconds, graphs dynamo compiled)
the median `train/step_seconds` of the steps after the first (metrics.jsonl), and the CPU seconds of the run's
process and the compilers it started (what compilation costs, whatever the load; with eager runs, less the eager
run's). Rounds alternate the trees and
eager/compiled, so load from other processes on a shared machine hits both alike; quote medians.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model.dim=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.n_kv_heads=1",
    "model.mlp_hidden=64",
    "model.max_seq_len=32",
    "trainer.batch_size=4",
    "trainer.eval_every=1000",
    "trainer.log_every=1",
    "trainer.progress=false",
    "data.max_bytes=300000",
    "logger=[jsonl]",
]


def run_once(tree: Path, overrides: list[str], compile: bool, steps: int, folder: Path, extra_env: dict[str, str]) -> dict[str, float]:
    run_dir = folder / "run"
    args = [
        sys.executable,
        str(tree / "launch.py"),
        *TINY,
        f"trainer.max_steps={steps}",
        *overrides,
        f"trainer.compile={str(compile).lower()}",
        f"trainer.compile_cache={folder / 'cache'}",
        f"hydra.run.dir={run_dir}",
    ]
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}  # the run's own (empty) cache folder
    env.update(extra_env)
    started, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the run's process and the compilers it waited for
    cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{result.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    seconds = [row["train/step_seconds"] for row in rows if "train/step_seconds" in row]
    events = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    report = next((e for e in events if e.get("type") == "compile"), {})
    return {
        "wall": wall,
        "cpu": cpu,
        "first_step": report.get("first_step_seconds", seconds[0]),
        "isa": report.get("isa_seconds", 0.0),  # inductor's vector-ISA checks, run before the first step since e75bd9e
        "graphs": report.get("graphs", 0),
        "step": statistics.median(seconds[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="a git revision of this repository to measure in turns with the checkout")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the first compiles)")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE: also this checkout with this environment variable")
    parser.add_argument("--no-eager", action="store_true", help="compiled runs only")
    parser.add_argument("overrides", nargs="*", default=["model=moe"], help="Hydra overrides (default: model=moe)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="moe_compile_") as tmp:
        trees = {"checkout": (ROOT, {})}
        for setting in args.env:
            key, _, value = setting.partition("=")
            trees[setting] = (ROOT, {key: value})
        if args.baseline:
            base = Path(tmp) / "baseline"
            base.mkdir()
            archive = subprocess.run(["git", "archive", args.baseline], cwd=ROOT, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
            trees = {args.baseline: (base, {}), **trees}
        results: dict[tuple[str, bool], list[dict[str, float]]] = {}
        for round_ in range(args.rounds):
            for index, (name, (tree, env)) in enumerate(trees.items()):
                for compile in (True,) if args.no_eager else (False, True):
                    folder = Path(tmp) / f"{index}-{compile}-{round_}"
                    measured = run_once(tree, args.overrides, compile, args.steps, folder, env)
                    results.setdefault((name, compile), []).append(measured)
                    print(f"round {round_} {name} compile={compile}: {measured}", flush=True)

    print(f"\n{' '.join(args.overrides)}, TINY dims, 2 layers; medians over {args.rounds} rounds (min-max); load {os.getloadavg()[0]:.1f}")
    print(
        "| tree | graphs | cold first compiled step s | ISA checks before it s | wall s, compiled run - eager run | CPU s, compiled run - eager run "
        "| eager step ms | compiled step ms | compiled / eager step |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in trees:
        compiled = results[(name, True)]
        eager = results.get((name, False), compiled)

        def spread(rows, key, scale=1.0):
            values = [row[key] * scale for row in rows]
            return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

        ratios = [c["step"] / e["step"] for e, c in zip(eager, compiled)]
        eager_cell = "-" if args.no_eager else spread(eager, "step", 1e3)
        ratio_cell = "-" if args.no_eager else f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        extra = [{key: c[key] - (0.0 if args.no_eager else e[key]) for key in ("cpu", "wall")} for e, c in zip(eager, compiled)]
        print(
            f"| {name} | {compiled[0]['graphs']} | {spread(compiled, 'first_step')} | {spread(compiled, 'isa')} | {spread(extra, 'wall')} "
            f"| {spread(extra, 'cpu')} | {eager_cell} | {spread(compiled, 'step', 1e3)} | {ratio_cell} |"
        )


if __name__ == "__main__":
    main()
