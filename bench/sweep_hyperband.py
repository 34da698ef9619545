"""Hyperband pruning against the same sweep unpruned: training steps, best value and wall time, as ratios
measured in the same run.

    python bench/sweep_hyperband.py                     # 12 trials each, Hydra's basic launcher
    python bench/sweep_hyperband.py --launcher submitit_local --n-jobs 2
    python bench/sweep_hyperband.py --sampler random    # both sweeps try the very same 12 learning rates

Both sweeps draw from the same space with the same sampler seed and start-up trials; the only difference is
the pruner. With --sampler random the two sweeps sample identical parameters, so any gap in the best value
is the pruner's doing; with TPE the Hyperband sweep also learns from its pruned trials and samples
differently. Steps are counted from each trial's journal (the last step it trained). The noise the best
values are judged against is the seed-to-seed spread of the unpruned best's own config: --noise-seeds more
runs of it with other seeds (their std).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# A small model and enough evals per trial for a pruner to act on (10 evals of 60 steps).
RUN = [
    "model.dim=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.n_kv_heads=1",
    "model.mlp_hidden=64",
    "model.max_seq_len=32",
    "trainer.batch_size=8",
    "trainer.max_steps=60",
    "trainer.eval_every=6",
    "trainer.eval_batches=2",
    "trainer.log_every=6",
    "trainer.progress=false",
    "optimizer.schedule.warmup_steps=6",
    "logger=[jsonl]",
]


SAMPLERS = {
    "tpe": ["sweep.sampler.n_startup_trials=4"],
    "random": ["sweep.sampler._target_=optuna.samplers.RandomSampler", "~sweep.sampler.n_startup_trials"],
}


def sweep(preset: str, folder: Path, n_trials: int, launcher: str, n_jobs: int, sampler: str) -> tuple[float, Path]:
    args = [sys.executable, str(ROOT / "launch.py"), "-m", f"sweep={preset}", f"sweep.n_trials={n_trials}", *SAMPLERS[sampler]]
    args += [f"sweep.n_jobs={n_jobs}", f"hydra/launcher={launcher}", f"hydra.sweep.dir={folder}", *RUN]
    started = time.perf_counter()
    subprocess.run(args, cwd=ROOT, check=True, capture_output=True, text=True)
    return time.perf_counter() - started, folder


def summary(folder: Path, study_name: str) -> dict:
    import optuna

    from currytrain.journal import read_journal
    from currytrain.sweep.study import open_storage

    study = optuna.load_study(study_name=study_name, storage=open_storage(f"sqlite:///{folder / 'optuna.db'}"))
    steps = 0
    for trial in study.trials:
        events = read_journal(Path(trial.user_attrs["run_dir"]) / "journal.jsonl")
        steps += max((e.get("step", 0) for e in events if e.get("type") in ("metrics", "eval", "finish")), default=0)
    states = {s: sum(t.state.name == s for t in study.trials) for s in ("COMPLETE", "PRUNED", "FAIL")}
    return {"steps": steps, "best": study.best_value, "best_params": study.best_params, "states": states}


def seed_noise(params: dict, seeds: int, folder: Path) -> float:
    """The std of the final val loss of one config over `seeds` more seeds (plus the sweep's own seed 0 run
    is not reused: every value here comes from the same command)."""
    import statistics

    from currytrain.journal import read_journal

    values = []
    for seed in range(1, seeds + 1):
        run_dir = folder / f"seed_{seed}"
        overrides = [f"{key}={value}" for key, value in params.items()]
        subprocess.run(
            [sys.executable, str(ROOT / "launch.py"), *RUN, *overrides, f"seed={seed}", f"hydra.run.dir={run_dir}"], cwd=ROOT, check=True, capture_output=True
        )
        values.append(next(e["val_loss"] for e in read_journal(run_dir / "journal.jsonl") if e["type"] == "finish"))
    return statistics.stdev(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-trials", type=int, default=12)
    parser.add_argument("--launcher", default="basic", help="basic or submitit_local")
    parser.add_argument("--n-jobs", type=int, default=1)
    parser.add_argument("--sampler", default="tpe", choices=sorted(SAMPLERS))
    parser.add_argument("--noise-seeds", type=int, default=3, help="extra seeds of the unpruned best config (0: skip)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for preset in ("tpe", "hyperband"):
            seconds, folder = sweep(preset, Path(tmp) / preset, args.n_trials, args.launcher, args.n_jobs, args.sampler)
            results[preset] = {**summary(folder, preset), "seconds": seconds}
            print(f"{preset:9s} {results[preset]}", flush=True)
        plain, pruned = results["tpe"], results["hyperband"]
        noise = seed_noise(plain["best_params"], args.noise_seeds, Path(tmp) / "noise") if args.noise_seeds > 1 else float("nan")
    print(f"\n{args.n_trials} trials, launcher={args.launcher}, n_jobs={args.n_jobs}, sampler={args.sampler}")
    print(f"training steps, hyperband / unpruned: {pruned['steps']} / {plain['steps']} = {pruned['steps'] / plain['steps']:.2f}")
    print(f"best val loss, hyperband vs unpruned: {pruned['best']:.4f} vs {plain['best']:.4f} (diff {pruned['best'] - plain['best']:+.4f})")
    print(
        f"seed noise of the unpruned best config (std over {args.noise_seeds} seeds): {noise:.4f}; diff / std = {(pruned['best'] - plain['best']) / noise:+.2f}"
    )
    print(f"wall time, hyperband / unpruned: {pruned['seconds']:.1f} s / {plain['seconds']:.1f} s = {pruned['seconds'] / plain['seconds']:.2f}")


if __name__ == "__main__":
    main()
