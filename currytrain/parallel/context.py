"""Context parallelism: causal ring attention over a sequence sharded across the cp ranks.

Layout (zig-zag, for causal load balance): the sequence is cut into 2 * cp chunks and rank r holds chunks r and
2 * cp - 1 - r, so every rank holds one early and one late chunk and does the same share of the causal work.

ring_attention(q, k, v, group): each rank keeps its queries; the key/value shards travel around the ring (P2P
through batch_isend_irecv, the next transfer started before this step's compute, so the two overlap). Each step
attends the local query chunks to the visiting key chunks at or before them (chunk pairs wholly in the future are
skipped) and merges the result into a running output with the online-softmax rule (log-sum-exp weights). The
backward runs two rings: the key/value shards move on as in the forward (the next hop started before this step's
compute), and each shard's gradient accumulator follows one step behind on its own ring, sent after a rank has added
its share and waited for by the next rank only when it adds its own, so the transfer overlaps that rank's compute.
After cp hops every accumulator is home, full.

Torch's own context_parallel fails for causal attention on CPU (probed with torch 2.13); this one runs on gloo.
apply_cp puts it into a GQA decoder: each Attention's core becomes the ring, and each block's RoPE tables are
indexed by the global positions of this rank's shard. The trainer hands each rank its zig-zag share of every
sequence (ParallelState.shard_sequence).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def zigzag_chunks(rank: int, cp: int) -> tuple[int, int]:
    """The two sequence chunks (of 2 * cp) rank `rank` holds."""
    return rank, 2 * cp - 1 - rank


def zigzag_shard(x: torch.Tensor, dim: int, rank: int, cp: int) -> torch.Tensor:
    """This rank's share of `x` along `dim` (the sequence): its two chunks, concatenated."""
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[index] for index in zigzag_chunks(rank, cp)], dim=dim)


def zigzag_positions(seq_len: int, rank: int, cp: int) -> torch.Tensor:
    """The global positions of this rank's share (what RoPE must rotate by)."""
    return zigzag_shard(torch.arange(seq_len), 0, rank, cp)


def apply_cp(model: torch.nn.Module, cp_mesh) -> None:
    """Context parallelism on a decoder whose blocks hold an `attention` (GQA), in place, over the 1-D `cp_mesh`."""
    group, rank, cp = cp_mesh.get_group(), cp_mesh.get_local_rank(), cp_mesh.size()

    def core(q, k, v, scale):
        return ring_attention(q, k, v, group, scale)

    def rope_at_shard_positions(block, args):
        h, cos, sin = args
        positions = zigzag_positions(h.shape[1] * cp, rank, cp).to(cos.device)
        return h, cos[positions], sin[positions]

    for block in model.layers:
        block.attention.core = core
        block.register_forward_pre_hook(rope_at_shard_positions)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup, scale: float | None = None) -> torch.Tensor:
    """Causal attention of zig-zag shards q, k, v (batch, heads, 2 * chunk, head_dim) over the ranks of `group`:
    this rank's share of the output of full-sequence causal attention."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _RingAttention.apply(q, k, v, group, scale)


def _ring_peers(group: dist.ProcessGroup) -> tuple[int, int, int, int]:
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    to_next = dist.get_global_rank(group, (rank + 1) % size)
    from_prev = dist.get_global_rank(group, (rank - 1) % size)
    return rank, size, to_next, from_prev


_GRAD_TAG = 1  # the gradient ring's messages, apart from the key/value ring's (tag 0) between the same two ranks


def _start_shift(tensors: list[torch.Tensor], to_next: int, from_prev: int, group, tag: int = 0) -> tuple[list[torch.Tensor], list]:
    """Send `tensors` to the next rank and receive the previous rank's into new buffers; returns (buffers, requests)."""
    received = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, to_next, group, tag) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, from_prev, group, tag) for r in received]
    return received, dist.batch_isend_irecv(ops)


def _wait(requests: list) -> None:
    for request in requests:
        request.wait()


def _pairs(rank: int, source: int, cp: int) -> list[tuple[int, int, bool]]:
    """(local query chunk, visiting key chunk, diagonal) for every pair not wholly in the future."""
    pairs = []
    for qi, q_chunk in enumerate(zigzag_chunks(rank, cp)):
        for ki, k_chunk in enumerate(zigzag_chunks(source, cp)):
            if k_chunk <= q_chunk:
                pairs.append((qi, ki, k_chunk == q_chunk))
    return pairs


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, diagonal: bool) -> torch.Tensor:
    scores = (q @ k.transpose(-1, -2)) * scale
    if diagonal:
        size = q.shape[-2]
        future = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, scale):
        rank, cp, to_next, from_prev = _ring_peers(group)
        q_chunks = list(q.chunk(2, dim=-2))
        out = [torch.zeros_like(c, dtype=torch.float32) for c in q_chunks]
        lse = [torch.full(c.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device) for c in q_chunks]
        kv = [k.contiguous(), v.contiguous()]
        for step in range(cp):
            pending = _start_shift(kv, to_next, from_prev, group) if step < cp - 1 else None
            source = (rank - step) % cp
            k_chunks, v_chunks = kv[0].chunk(2, dim=-2), kv[1].chunk(2, dim=-2)
            for qi, ki, diagonal in _pairs(rank, source, cp):
                scores = _scores(q_chunks[qi].float(), k_chunks[ki].float(), scale, diagonal)
                block_lse = torch.logsumexp(scores, dim=-1)
                block_out = torch.exp(scores - block_lse.unsqueeze(-1)) @ v_chunks[ki].float()
                merged = torch.logaddexp(lse[qi], block_lse)
                out[qi] = out[qi] * torch.exp(lse[qi] - merged).unsqueeze(-1) + block_out * torch.exp(block_lse - merged).unsqueeze(-1)
                lse[qi] = merged
            if pending is not None:
                kv, requests = pending
                _wait(requests)
        output = torch.cat(out, dim=-2)
        ctx.save_for_backward(q, k, v, output, torch.cat(lse, dim=-1))
        ctx.group, ctx.scale = group, scale
        return output.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, output, lse = ctx.saved_tensors
        group, scale = ctx.group, ctx.scale
        rank, cp, to_next, from_prev = _ring_peers(group)
        grad_out = grad_out.float()
        # D = rowsum(dO * O): the softmax backward's correction term, per query.
        delta = (grad_out * output).sum(-1)
        q_chunks, do_chunks = q.float().chunk(2, dim=-2), grad_out.chunk(2, dim=-2)
        lse_chunks, delta_chunks = lse.chunk(2, dim=-1), delta.chunk(2, dim=-1)
        grad_q = [torch.zeros_like(c) for c in q_chunks]
        # Two rings. The key/value shards move on as in the forward: the next hop starts before this step's compute,
        # which does not change them. The gradient accumulator of the visiting shard follows one step behind on its own
        # ring: it left the previous rank after that rank's compute, travels during this step's compute, and is waited
        # for only when this step's contribution is added to it. After cp hops it is home, full.
        kv, grad_kv, incoming = [k.contiguous(), v.contiguous()], None, None
        for step in range(cp):
            pending = _start_shift(kv, to_next, from_prev, group) if step < cp - 1 else None
            block = _block_grad_kv(q_chunks, do_chunks, lse_chunks, delta_chunks, grad_q, kv, rank, (rank - step) % cp, cp, scale)
            if incoming is None:
                grad_kv = block
            else:
                received, requests = incoming
                _wait(requests)
                grad_kv = [r + b for r, b in zip(received, block)]
            if cp > 1:
                incoming = _start_shift(grad_kv, to_next, from_prev, group, tag=_GRAD_TAG)
            if pending is not None:
                kv, requests = pending
                _wait(requests)
        if incoming is not None:
            grad_kv, requests = incoming
            _wait(requests)
        grad_k, grad_v = grad_kv
        return torch.cat(grad_q, dim=-2).to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None


def _block_grad_kv(q_chunks, do_chunks, lse_chunks, delta_chunks, grad_q, kv, rank, source, cp, scale) -> list[torch.Tensor]:
    """This rank's share of the gradient of the visiting key/value shard (from rank `source`), fp32; adds the same
    pairs' share of the query gradient into `grad_q` (in place, per chunk)."""
    k_chunks, v_chunks = kv[0].float().chunk(2, dim=-2), kv[1].float().chunk(2, dim=-2)
    grad_k = [torch.zeros_like(c) for c in k_chunks]
    grad_v = [torch.zeros_like(c) for c in v_chunks]
    for qi, ki, diagonal in _pairs(rank, source, cp):
        probs = torch.exp(_scores(q_chunks[qi], k_chunks[ki], scale, diagonal) - lse_chunks[qi].unsqueeze(-1))
        grad_v[ki] = grad_v[ki] + probs.transpose(-1, -2) @ do_chunks[qi]
        grad_scores = probs * (do_chunks[qi] @ v_chunks[ki].transpose(-1, -2) - delta_chunks[qi].unsqueeze(-1)) * scale
        grad_q[qi] = grad_q[qi] + grad_scores @ k_chunks[ki]
        grad_k[ki] = grad_k[ki] + grad_scores.transpose(-1, -2) @ q_chunks[qi]
    return [torch.cat(grad_k, dim=-2), torch.cat(grad_v, dim=-2)]
