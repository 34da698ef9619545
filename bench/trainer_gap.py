"""Where curryTrain's full step loses to the plain-PyTorch one: the Trainer, run_accumulated_step's step alone, a
hand-written step of the same curryTrain model, and bench/peers.py's plain Llama, alternating on the same batches.

    python bench/trainer_gap.py                          # tiny, fp32, 60 rounds
    python bench/trainer_gap.py --precision bf16 --rounds 100
    python bench/trainer_gap.py --size small --rounds 10

Trainer vs accumulated_step is the loop's own work (batch sampling, the schedule, bookkeeping, logging);
accumulated_step vs hand step is the step's (the loss accumulator, the finiteness check); hand step vs plain is the
model's (curryTrain keeps separate q/k/v and gate/up projections, the plain model fuses them).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing it

from peers import BATCH, PlainLlama, build_trainer, hand_step  # noqa: E402

from currytrain.benchmark import alternating_step_times  # noqa: E402
from currytrain.trainer.step import accumulated_step  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", choices=sorted(BATCH))
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        trainer, cfg = build_trainer(args.size, args.precision, args.rounds + args.warmup, Path(workdir) / "run")
        m, dtype = cfg.model, trainer.autocast_dtype
        torch.manual_seed(0)
        plain = PlainLlama(m.vocab_size, m.dim, m.n_layers, m.n_heads, m.n_kv_heads, m.mlp_hidden, m.max_seq_len)
        models = {"hand": copy.deepcopy(trainer.model), "step": copy.deepcopy(trainer.model), "plain": plain}
        optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True) for name, model in models.items()}
        params = list(models["step"].parameters())
        batches = [trainer.data.batch("train", step, 0, BATCH[args.size]) for step in range(args.rounds + args.warmup)]
        contenders = {
            "Trainer.train_step": lambda step: trainer.train_step(),
            "accumulated_step": lambda step: accumulated_step(
                models["step"], optimizers["step"], [batches[step]], grad_clip=cfg.trainer.grad_clip, autocast_dtype=dtype, parameters=params
            ),
            "hand step, same model": lambda step: hand_step(models["hand"], optimizers["hand"], batches[step], dtype, lambda model, x: model(x)),
            "plain": lambda step: hand_step(plain, optimizers["plain"], batches[step], dtype, lambda model, x: model(x)),
        }
        times = alternating_step_times(contenders, rounds=args.rounds, warmup=args.warmup)
        trainer.loggers.close()
    base = statistics.median(times["plain"])
    print(f"{args.size} {args.precision}, {args.rounds} alternating rounds, medians")
    for name, values in times.items():
        print(f"{name:<24}{statistics.median(values) * 1e3:9.2f} ms/step   {base / statistics.median(values):.3f}x plain's speed")


if __name__ == "__main__":
    main()
