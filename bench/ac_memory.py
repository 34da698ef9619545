"""Peak activation memory of one training step under each activation-checkpointing mode, on CPU.

    python bench/ac_memory.py                                  # 8-layer debug GQA, batch 8 x 128 tokens
    python bench/ac_memory.py model/size=tiny trainer.batch_size=4   # any Hydra override of launch.py (CPU only: it counts CPU allocations)

Method: torch.profiler(profile_memory=True) records every CPU allocator allocation and free during the
step. Their running sum is the memory the step holds above what existed before it (weights and
gradients are allocated beforehand, so they do not count). Per mode:
  held: bytes still allocated when forward + loss end, i.e. what autograd keeps for backward;
  peak: the highest running sum over forward + backward (adds backward's recomputation and temporaries);
  step s: the fastest of 5 unprofiled forward + backward passes.
Ratios are against ac=none measured in the same run; the model is built and parallelized as the trainer
does it (build_components), from the same seed for every mode.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from currytrain.benchmark import build_step_setup  # noqa: E402
from currytrain.config import compose_config  # noqa: E402
from currytrain.model.protocol import causal_lm_loss  # noqa: E402

MODES = {
    "none": ["model.ac=none"],
    "full": ["model.ac=full"],
    "selective block, every 2nd": ["model.ac=selective", "model.ac_policy=block", "model.ac_every=2"],
    "selective op (keep matmuls)": ["model.ac=selective", "model.ac_policy=op"],
}
DEFAULTS = ["model.n_layers=8", "trainer.batch_size=8", "trainer.device=cpu"]


def _allocations(prof: profile) -> list[int]:
    """Signed sizes (bytes) of the CPU allocations (+) and frees (-) a profile saw, in time order."""
    from torch._C._profiler import _EventType

    found, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            found.append((event.start_time_ns, event.extra_fields.alloc_size))
    return [size for _, size in sorted(found)]


def _net_and_peak(sizes: list[int]) -> tuple[int, int]:
    live = peak = 0
    for size in sizes:
        live += size
        peak = max(peak, live)
    return live, peak


def measure(overrides: list[str], repeats: int = 5) -> dict[str, float]:
    cfg = compose_config(overrides)
    model = build_step_setup(cfg).model  # seeded and parallelized (AC applied) as a run builds it
    generator = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.randint(0, cfg.model.vocab_size, (cfg.trainer.batch_size, cfg.data.seq_len + 1), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    # One step first, so that gradients already exist and backward accumulates into them in place.
    causal_lm_loss(model(inputs), targets).backward()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as forward_prof:
        loss = causal_lm_loss(model(inputs), targets)
    held, forward_peak = _net_and_peak(_allocations(forward_prof))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as backward_prof:
        loss.backward()
    _, backward_peak = _net_and_peak(_allocations(backward_prof))
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        causal_lm_loss(model(inputs), targets).backward()
        seconds.append(time.perf_counter() - started)
    return {"held": held, "peak": max(forward_peak, held + backward_peak), "seconds": min(seconds)}


def main(user_overrides: list[str]) -> None:
    results = {name: measure([*DEFAULTS, *user_overrides, *mode]) for name, mode in MODES.items()}
    base = results["none"]
    print(f"overrides: {' '.join([*DEFAULTS, *user_overrides])}")
    print(f"{'model.ac':<30}{'held MiB':>10}{'x none':>8}{'peak MiB':>10}{'x none':>8}{'step s':>8}{'x none':>8}")
    for name, result in results.items():
        print(
            f"{name:<30}{result['held'] / 2**20:>10.1f}{result['held'] / base['held']:>8.2f}"
            f"{result['peak'] / 2**20:>10.1f}{result['peak'] / base['peak']:>8.2f}"
            f"{result['seconds']:>8.3f}{result['seconds'] / base['seconds']:>8.2f}"
        )
    cut = 1 - results["full"]["peak"] / base["peak"]
    print(f"full AC cuts peak activation memory by {cut:.0%} (held for backward: {1 - results['full']['held'] / base['held']:.0%})")


if __name__ == "__main__":
    main(sys.argv[1:])
