"""What an evaluation costs, in training steps of the same model: each shipped task (and a held-out text set)
evaluated on the model of a config, against the median optimizer step of that config, timed in one process.

    python bench/eval_cost.py                           # the default run's model (model/size=debug), one thread
    python bench/eval_cost.py model/size=tiny --limit 20

Printed per evaluator: seconds of one evaluation (the median of --rounds, after a first untimed one) and that in
training steps. The model is untrained, so a generation task never meets its stop string and runs its whole
max_gen_toks: the cost of curry_complete is its most.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing it

from currytrain.benchmark import build_step_setup, step_benchmark  # noqa: E402
from currytrain.config import compose_config  # noqa: E402
from currytrain.eval.config import SHIPPED_TASKS  # noqa: E402
from currytrain.eval.live import LiveModel  # noqa: E402
from currytrain.eval.runner import Evaluators  # noqa: E402
from currytrain.eval.synthetic import held_out_files  # noqa: E402
from currytrain.eval.text import byte_codec  # noqa: E402


def seconds(evaluators: Evaluators, live: LiveModel, rounds: int) -> float:
    evaluators.prepare(live, byte_codec())
    evaluators.run(live)  # untimed: first-call costs
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        evaluators.run(live)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="launch.py overrides of the model and data (a byte-level run)")
    parser.add_argument("--limit", type=int, default=0, help="documents per task (default 0: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0: torch's own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = compose_config([*args.overrides, "trainer.precision=fp32"])
    step = step_benchmark(cfg, steps=10, warmup=2)["step_seconds"]["median"]
    parts = build_step_setup(cfg)
    live = LiveModel(parts.model, parts.state, None, int(cfg.data.seq_len))
    with tempfile.TemporaryDirectory() as folder:
        text = Path(folder) / "held.txt"
        text.write_text("".join(path.read_text(encoding="utf-8", errors="replace") for path in held_out_files()[:8]))
        evaluators = {task: Evaluators(tasks=[task], limit=args.limit) for task in SHIPPED_TASKS}
        evaluators["text set (32k tokens)"] = Evaluators(texts={"held": str(text)}, max_tokens=32768)
        print(
            f"{cfg.model._target_.rpartition('.')[2]} ({sum(p.numel() for p in parts.model.parameters()) / 1e6:.2f}M parameters), context {cfg.data.seq_len}, "
        )
        print(f"threads={torch.get_num_threads()}; a training step: {step * 1e3:.1f} ms (median of 10)\n")
        print("| evaluator | documents | seconds | training steps |")
        print("|---|---|---|---|")
        for name, evaluator in evaluators.items():
            cost = seconds(evaluator, live, args.rounds)
            documents = args.limit or "all"
            print(f"| {name} | {documents if evaluator.tasks else '-'} | {cost:.2f} | {cost / step:.0f} |")


if __name__ == "__main__":
    main()
