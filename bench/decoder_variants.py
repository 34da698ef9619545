"""Benchmark: one forward + backward of the debug GQA decoder with each architecture field of the HF families
(docs/model.md#architecture-fields) against the plain decoder, same process, interleaved, one thread.

    python bench/decoder_variants.py              # 15 rounds
    python bench/decoder_variants.py --rounds 30

Prints each variant's median step time and its ratio to the plain model's. The plain model's own code path is
the one it had before the fields existed (tests/test_decoder.py holds its init and logits).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing it

from currytrain.model.gqa import GQATransformer  # noqa: E402

DEBUG = dict(vocab_size=256, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, mlp_hidden=384, max_seq_len=128)
VARIANTS = {
    "plain": {},
    "sandwich + 1+w norms + GeGLU + sqrt(dim) (Gemma)": dict(
        norm_position="sandwich", norm_unit_offset=True, mlp_activation="gelu_tanh", scale_embeddings=True
    ),
    "attn_softcap=50 (written-out attention)": dict(attn_softcap=50.0),
    "logit_softcap=30": dict(logit_softcap=30.0),
    "layer_types=[sliding,full], window 32, local RoPE": dict(sliding_window=32, layer_types=["sliding", "full"], rope_local_theta=100.0),
    "post norms + projection qk-norm (OLMo 2)": dict(norm_position="post", qk_norm=True, qk_norm_scope="projection"),
    "partial rotary rope_dim=16 (Phi-3)": dict(rope_dim=16),
    "latent attention kv 32, q 48 (DeepSeek)": dict(kv_lora_rank=32, q_lora_rank=48, rope_dim=16, n_kv_heads=4, head_dim=48),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokens = torch.randint(0, DEBUG["vocab_size"], (8, DEBUG["max_seq_len"]), generator=torch.Generator().manual_seed(0))
    models = {}
    for name, fields in VARIANTS.items():
        torch.manual_seed(0)
        models[name] = GQATransformer(**{**DEBUG, **fields})
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(args.rounds):
        for name in list(models) if round_ % 2 else list(models)[::-1]:  # alternate the order: noise hits all alike
            start = time.perf_counter()
            models[name](tokens).float().logsumexp(-1).mean().backward()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["plain"][2:])
    print(f"{'variant':52s}{'step ms':>9s}{'x plain':>9s}")
    for name, samples in times.items():
        median = statistics.median(samples[2:])
        print(f"{name:52s}{median * 1e3:9.1f}{median / base:9.2f}")


if __name__ == "__main__":
    main()
