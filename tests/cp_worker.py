"""What the workers of tests/test_model_parallel.py's ring-attention test run: ring attention on zig-zag shards
against full-sequence causal SDPA, forward and backward."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from currytrain.parallel.context import ring_attention, zigzag_shard


def ring_vs_sdpa(seq_len: int) -> dict[str, float]:
    """Largest absolute difference of this rank's output and q/k/v gradients from SDPA's (same shard)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        rank, cp = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)  # every rank draws the same full tensors
        q, k, v, grad_out = (torch.randn(2, 3, seq_len, 16) for _ in range(4))
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        want = F.scaled_dot_product_attention(*full, is_causal=True)
        want.backward(grad_out)
        shards = [zigzag_shard(t, 2, rank, cp).requires_grad_() for t in (q, k, v)]
        got = ring_attention(*shards, group=dist.group.WORLD)
        got.backward(zigzag_shard(grad_out, 2, rank, cp))
        errors = {"out": (got - zigzag_shard(want, 2, rank, cp)).abs().max().item()}
        for name, shard, whole in zip("qkv", shards, full):
            errors[f"grad_{name}"] = (shard.grad - zigzag_shard(whole.grad, 2, rank, cp)).abs().max().item()
        return errors
    finally:
        dist.destroy_process_group()
