"""Does the ring-attention backward gain from overlapping its transfers with compute? Times forward + backward of
currytrain.parallel.context.ring_attention on gloo workers for two backward schedules:

- wait-each-hop (the reference below, the schedule before the overlap): after each step's compute the key/value shard
  and its gradient accumulator travel together to the next rank, and the step waits for them before going on;
- overlapped (currytrain's): the next key/value hop starts before this step's compute, and the gradient accumulators
  ride their own ring, waited for only when this rank adds its share.

The forward is the same in both. Each round times both (the order alternating between rounds, a barrier before each
timing) and the medians over rounds are printed with their ratio. Both must give the same gradients (checked first).

    .venv/bin/python bench/cp_overlap.py                    # 2 workers, seq 4096, 8 heads of 64, 7 rounds
    .venv/bin/python bench/cp_overlap.py --nproc 4 --seq 8192 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from currytrain.parallel import context  # noqa: E402


class WaitEachHop(context._RingAttention):
    """The reference: the backward as it was before the overlap (one ring, each hop waited for before the next step)."""

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, output, lse = ctx.saved_tensors
        group, scale = ctx.group, ctx.scale
        rank, cp, to_next, from_prev = context._ring_peers(group)
        grad_out = grad_out.float()
        delta = (grad_out * output).sum(-1)
        q_chunks, do_chunks = q.float().chunk(2, dim=-2), grad_out.chunk(2, dim=-2)
        lse_chunks, delta_chunks = lse.chunk(2, dim=-1), delta.chunk(2, dim=-1)
        grad_q = [torch.zeros_like(c) for c in q_chunks]
        travel = [k.contiguous(), v.contiguous(), torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)]
        for step in range(cp):
            block = context._block_grad_kv(q_chunks, do_chunks, lse_chunks, delta_chunks, grad_q, travel[:2], rank, (rank - step) % cp, cp, scale)
            travel = [travel[0], travel[1], travel[2] + block[0], travel[3] + block[1]]
            if cp == 1:
                break
            moving = travel if step < cp - 1 else travel[2:]  # the last hop carries only the gradients home
            received, requests = context._start_shift(moving, to_next, from_prev, group)
            context._wait(requests)
            travel = received if step < cp - 1 else travel[:2] + received
        return torch.cat(grad_q, dim=-2).to(q.dtype), travel[2].to(k.dtype), travel[3].to(v.dtype), None, None


SCHEDULES = {"wait-each-hop": WaitEachHop, "overlapped": context._RingAttention}


def forward_backward(function, q, k, v, grad_out) -> tuple[float, list[torch.Tensor]]:
    """Seconds of one forward + backward on this rank (after a barrier), and the q/k/v gradients."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    dist.barrier()
    start = time.perf_counter()
    function.apply(*leaves, dist.group.WORLD, q.shape[-1] ** -0.5).backward(grad_out)
    seconds = time.perf_counter() - start
    return seconds, [t.grad for t in leaves]


def transfers_alone(k: torch.Tensor, v: torch.Tensor) -> float:
    """Seconds of the backward's messages with no compute (cp - 1 key/value hops, cp gradient hops, each waited):
    the most that overlapping can hide."""
    _, cp, to_next, from_prev = context._ring_peers(dist.group.WORLD)
    grads = [torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)]
    dist.barrier()
    start = time.perf_counter()
    for step in range(cp):
        moving = [k, v, *grads] if step < cp - 1 else grads
        context._wait(context._start_shift(moving, to_next, from_prev, dist.group.WORLD)[1])
    return time.perf_counter() - start


def worker(args: argparse.Namespace) -> dict[str, list[float]] | None:
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    try:
        rank, cp = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(rank)
        shard = (args.batch, args.heads, args.seq // cp, args.head_dim)
        q, k, v, grad_out = (torch.randn(shard) for _ in range(4))
        reference, overlapped = (forward_backward(SCHEDULES[name], q, k, v, grad_out)[1] for name in SCHEDULES)
        worst = max((a - b).abs().max().item() for a, b in zip(reference, overlapped))
        assert worst < 1e-5, f"rank {rank}: the two schedules' gradients differ by {worst}"
        times: dict[str, list[float]] = {name: [] for name in (*SCHEDULES, "transfers")}
        for round_ in range(args.rounds):
            order = list(SCHEDULES) if round_ % 2 == 0 else list(reversed(SCHEDULES))
            for name in (*order, "transfers"):
                took = transfers_alone(k, v) if name == "transfers" else forward_backward(SCHEDULES[name], q, k, v, grad_out)[0]
                seconds = torch.tensor(took)
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # a step takes as long as its slowest rank
                times[name].append(seconds.item())
        return times if rank == 0 else None
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2, help="cp ranks (gloo worker processes)")
    parser.add_argument("--seq", type=int, default=4096, help="whole sequence length (each rank holds seq / nproc)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds, each running both schedules")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    args = parser.parse_args()
    if args.seq % (2 * args.nproc):
        parser.error(f"--seq {args.seq} must split into {2 * args.nproc} equal chunks")
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=args.nproc, rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, run_id="cp-overlap"
    )
    times = elastic_launch(config, worker)(args)[0]
    print(
        f"ring attention forward+backward, cp={args.nproc} gloo workers x {args.threads} thread, "
        f"q/k/v {args.batch}x{args.heads}x{args.seq}x{args.head_dim} fp32, median of {args.rounds} rounds (slowest rank)"
    )
    baseline = statistics.median(times["wait-each-hop"])
    for name in SCHEDULES:
        median = statistics.median(times[name])
        print(f"{name:<14} {median * 1e3:>9.1f} ms  {baseline / median:>5.2f}x")
    print(f"(the backward's transfers alone, no compute: {statistics.median(times['transfers']) * 1e3:.1f} ms, the most overlap can hide)")


if __name__ == "__main__":
    main()
