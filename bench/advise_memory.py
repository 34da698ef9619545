"""How close is `currytrain advise`'s per-rank peak memory to what a run holds? Runs `launch.py` for each layout
twice, with a large model and with a tiny one of the same layout, and compares the difference of the workers'
peak resident memory (the tiny run's is torch, gloo and Python: the same in both) with the advisor's predicted
peak for the large model (minus its prediction for the tiny one).

    .venv/bin/python bench/advise_memory.py                 # every layout below, 2 workers where parallel
    .venv/bin/python bench/advise_memory.py --layouts single fsdp

Peak resident memory is the largest worker's (wait4's ru_maxrss covers the launcher and every worker it
waited for). The runs get MALLOC_MMAP_THRESHOLD_=65536: glibc then maps every tensor-sized block on its own and
unmaps it when freed, so resident memory follows the live tensors; with glibc's default, freed blocks stay
resident and a sharded layout's transient gathers look permanent (fsdp measured 1.6x its live bytes).
CPU only: on a GPU, torch.cuda.max_memory_allocated would be the measure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from currytrain.advise import Layout, count_split_parameters, predict  # noqa: E402
from currytrain.config import compose_config  # noqa: E402

COMMON = [
    "data=synthetic",
    "trainer.max_steps=3",
    "trainer.eval_every=3",
    "trainer.eval_batches=1",
    "trainer.progress=false",
    "logger=[jsonl]",
    "optimizer.schedule.warmup_steps=1",
]
LARGE = [
    "model.dim=512",
    "model.n_layers=8",
    "model.n_heads=8",
    "model.n_kv_heads=4",
    "model.mlp_hidden=1536",
    "model.max_seq_len=256",
    "data.vocab_size=8192",
    "model.vocab_size=8192",
    "trainer.batch_size=8",
]
TINY = [
    "model.dim=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.n_kv_heads=2",
    "model.mlp_hidden=64",
    "model.max_seq_len=256",
    "data.vocab_size=256",
    "model.vocab_size=256",
    "trainer.batch_size=8",
]
MOE = ["model=moe", "model.num_experts=4", "model.top_k=2", "model.expert_hidden=768"]
LAYOUTS = {
    "single": (["parallel=single"], Layout(1, 0)),
    "ddp": (["parallel=ddp"], Layout(2, 0)),
    "zero1": (["parallel=zero1"], Layout(2, 1)),
    "fsdp": (["parallel=fsdp"], Layout(2, 3)),
    "tp": (["parallel=tp"], Layout(1, 0, tp=2)),
    "pp": (["parallel=pp", "trainer.grad_accum=2"], Layout(1, 0, pp=2)),
    "ep": (["parallel=ep", *MOE], Layout(2, 0, ep=2)),
}


def peak_rss(overrides: list[str], run_dir: Path) -> int:
    """Bytes: the largest peak resident set of the launch and its workers."""
    args = [sys.executable, str(ROOT / "launch.py"), *overrides, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(overrides)} failed ({process.returncode}):\n{process.stderr.read()[-2000:]}")
    return usage.ru_maxrss * 1024


def predicted_peak(overrides: list[str], layout: Layout) -> int:
    cfg = compose_config(overrides)
    return predict(cfg, layout, *count_split_parameters(cfg.model)).peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    args = parser.parse_args()
    print(f"{'layout':<8} {'predicted':>10} {'measured':>10} {'ratio':>6}   (MiB per rank; measured = peak RSS large - tiny)")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.layouts:
            extra, layout = LAYOUTS[name]
            large, tiny = [*COMMON, *LARGE, *extra], [*COMMON, *TINY, *extra]
            if name == "ep":  # the tiny model keeps the expert count that ep divides
                tiny = [*tiny, "model.expert_hidden=64"]
            measured = peak_rss(large, Path(folder) / f"{name}_large") - peak_rss(tiny, Path(folder) / f"{name}_tiny")
            predicted = predicted_peak(large, layout) - predicted_peak(tiny, layout)
            print(f"{name:<8} {predicted / 2**20:>10.0f} {measured / 2**20:>10.0f} {predicted / measured:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
