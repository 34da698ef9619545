"""What the workers of tests/test_eval.py's sharded-generation test run: each rank generates for its own prompts (of
different lengths, counts and stop strings) through the adapter's in-step path, and writes what it generated."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from currytrain.components import parallel_session
from currytrain.eval.live import LiveModel
from currytrain.workers import worker_threads

PROMPTS = [
    [("def f(x):\n    return", {"until": ["\n", "7"], "max_gen_toks": 12})],
    [("import os\n", {"until": ["(", "0"], "max_gen_toks": 20}), ("x", {"until": [], "max_gen_toks": 3}), ("class A:", {"max_gen_toks": 7})],
]
"""Rank r's (context, generation options): rank 0 has one prompt, rank 1 three (rank 0 pads two). The random
model (seed 0) writes a 7 and a 0 early on: those stop strings end two generations before their max_gen_toks."""


def generate_each(resolved: str, out: str) -> None:
    from currytrain.eval.lm import CurryTrainLM
    from currytrain.eval.text import byte_codec

    torch.set_num_threads(worker_threads())
    cfg = OmegaConf.load(resolved)
    with parallel_session(cfg) as state:
        torch.manual_seed(0)
        from currytrain.model import build_model

        model = build_model(cfg.model).eval()
        live = LiveModel(model, state, None, 64)
        lm = CurryTrainLM(live, byte_codec(), batch_size=2, max_new_tokens=8, seed=0, task_files={})
        requests = [type("Request", (), {"args": prompt, "task_name": "t"})() for prompt in PROMPTS[state.rank]]
        texts = lm.generate_until(requests)
        Path(out, f"rank{state.rank}.json").write_text(json.dumps(texts))
