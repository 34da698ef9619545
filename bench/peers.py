"""curryTrain's full training step against the implementations a user would pick instead, same config.

    python bench/peers.py --compile --sizes tiny small medium   # the table of docs/performance.md (~25 min on 2 cores)
    python bench/peers.py                                       # tiny and small, fp32 and bf16, eager, 3 repeats
    python bench/peers.py --sizes tiny --precisions fp32 --steps 10
    python bench/peers.py --sizes tiny --precisions fp32 --compile --only curryTrain+compile plain+compile --faults
    python bench/peers.py --sizes tiny --precisions fp32 --compile --only curryTrain curryTrain+compile plain plain+compile split split+compile

Contenders, each stepping the same Llama-shaped model (GQA, RoPE, RMSNorm, SwiGLU) on the same random
tokens (each read from the same data when it steps) with AdamW and gradient clipping:
  curryTrain   Trainer.train_step(): the real loop with metrics, journal, loggers and progress bookkeeping
  plain        a plain-PyTorch Llama written here, stepped by a hand-written loop (no framework)
  transformers LlamaForCausalLM with the equivalent LlamaConfig, stepped by the same hand-written loop
  split        (with --only) plain's Llama with q, k, v and gate, up projected apart as curryTrain's model has them:
               what curryTrain's loop costs over a hand loop of the same parameterization
  with --compile, also: curryTrain+compile (trainer.compile=true) and plain+compile (torch.compile(model),
  the loss eager); their compilation falls in the warm-up rounds (the cache is shared by the repeats; dynamo
  is reset between cells, so that each compiles for its own shapes as a run does, not with dynamic shapes)
Sizes: model/size=tiny (batch 4 x 128), small (8 x 256), medium (~125M parameters, 2 x 256).
Each round steps every contender once, in turn (so load from other processes hits all alike), the rounds'
orders a balanced Latin square (each contender runs right after each other one equally often: the one after a
compiled contender ran measurably slower, and a fixed cycle always put curryTrain there); the first rounds are
warm-up, and each repeat starts where the last one's rows ended.
Printed: a markdown table, one row per cell (size, precision, eager or compiled): each contender's tokens/s
(the median over the repeats of its median step), curryTrain's speed over plain PyTorch's in the same mode (eager
against plain, compiled against plain+compile) as the median of the repeats' ratios (each the ratio of the two
median steps) with their min-max, transformers' over plain likewise, and MFU against a matmul roofline measured
in the same run for the dtype (model FLOPs as in `currytrain bench`). --faults adds each contender's minor page faults
per step (each repeat's median): a contender that allocates what the others just returned to the OS pays for fresh
pages, which a run of one model need not (with only the two compiled contenders stepping, plain + compile's eager
loss faulted in 0-1,600 pages a step and curryTrain's one graph 0-64; with an eager contender in the rounds, none did:
docs/performance.md).
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing it

from currytrain.benchmark import alternating_step_times, matmul_roofline, model_flops_per_token  # noqa: E402
from currytrain.config import compose_config  # noqa: E402
from currytrain.run import write_run_record  # noqa: E402
from currytrain.trainer.trainer import Trainer  # noqa: E402

BATCH = {"tiny": 4, "small": 8, "medium": 2}
SEQ = {"tiny": 128, "small": 256, "medium": 256}
VOCAB = {"tiny": 1024, "small": 8192, "medium": 32768}


class PlainBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, hidden: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.norm1, self.norm2 = nn.RMSNorm(dim, eps=1e-5), nn.RMSNorm(dim, eps=1e-5)
        self.qkv = nn.Linear(dim, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.qkv(x).split([self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim, self.n_kv_heads * self.head_dim], -1)

    def gate_and_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gate_up(x).chunk(2, -1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.project(self.norm1(x))
        q = _rope(q.view(batch, seq, self.n_heads, self.head_dim), cos, sin).transpose(1, 2)
        k = _rope(k.view(batch, seq, self.n_kv_heads, self.head_dim), cos, sin).transpose(1, 2)
        v = v.view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.out(attention.transpose(1, 2).reshape(batch, seq, -1))
        gate, up = self.gate_and_up(self.norm2(x))
        return x + self.down(F.silu(gate) * up)


class SplitBlock(PlainBlock):
    """PlainBlock with q, k, v and gate, up projected apart, as curryTrain's model (and torchtitan's and
    transformers' Llama) keep them: the same parameterization, so the difference to curryTrain is the framework."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, hidden: int):
        super().__init__(dim, n_heads, n_kv_heads, hidden)
        del self.qkv, self.gate_up
        self.q = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.k, self.v = (nn.Linear(dim, n_kv_heads * self.head_dim, bias=False) for _ in range(2))
        self.gate, self.up = (nn.Linear(dim, hidden, bias=False) for _ in range(2))

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q(x), self.k(x), self.v(x)

    def gate_and_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gate(x), self.up(x)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + rotated * sin[:, None]


class PlainLlama(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, n_heads: int, n_kv_heads: int, hidden: int, seq: int, block: type[PlainBlock] = PlainBlock):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(block(dim, n_heads, n_kv_heads, hidden) for _ in range(layers))
        self.norm, self.output = nn.RMSNorm(dim, eps=1e-5), nn.Linear(dim, vocab, bias=False)
        head_dim = dim // n_heads
        angles = torch.outer(torch.arange(seq).float(), 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("cos", torch.cat([angles.cos()] * 2, -1), persistent=False)
        self.register_buffer("sin", torch.cat([angles.sin()] * 2, -1), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x, seq = self.tok_embeddings(tokens), tokens.shape[1]
        for layer in self.layers:
            x = layer(x, self.cos[:seq], self.sin[:seq])
        return self.output(self.norm(x))


def hf_llama(m) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=m.vocab_size, hidden_size=m.dim, num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
        num_key_value_heads=m.n_kv_heads, intermediate_size=m.mlp_hidden, max_position_embeddings=m.max_seq_len,
        rms_norm_eps=m.norm_eps, rope_theta=m.rope_theta, attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config)


def hand_step(model: nn.Module, optimizer, batch, dtype, logits_of) -> None:
    inputs, targets = batch
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        logits = logits_of(model, inputs)
    F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def build_trainer(size: str, precision: str, steps: int, run_dir: Path, *extra: str) -> tuple[Trainer, DictConfig]:
    overrides = [
        f"model/size={size}",
        f"trainer.batch_size={BATCH[size]}",
        f"trainer.precision={precision}",
        "trainer.progress=false",
        "data=synthetic",
        f"data.seq_len={SEQ[size]}",
        *extra,
    ]
    cfg = compose_config([*overrides, f"data.vocab_size={VOCAB[size]}", f"trainer.max_steps={steps + 1}", "trainer.eval_every=100000"])
    write_run_record(cfg, run_dir, overrides, Path.cwd())
    return Trainer(cfg, run_dir), cfg


@dataclass
class Measured:
    times: dict[str, list[float]]
    """Each contender's step seconds, one per round (index i: the same round for every contender)."""
    faults: dict[str, list[int]]
    """Each contender's minor page faults, one count per step (warm-up included)."""
    tokens: int
    roofline_seconds: float
    """The step's model FLOPs over the dtype's matmul roofline: MFU is this over a step's seconds."""

    def rate(self, name: str) -> float:
        return self.tokens / statistics.median(self.times[name])

    def mfu(self, name: str) -> float:
        return self.roofline_seconds / statistics.median(self.times[name])

    def speedup(self, name: str, over: str) -> float:
        """`name`'s speed over `over`'s: the ratio of their median steps. Not the median of each round's ratio:
        a contender that ends one round and starts the next runs its second step on warm caches, and the
        rounds' ratios then split in two clusters whose median is anywhere between them (two contenders whose
        medians differed by 2% gave 1.096x that way)."""
        return statistics.median(self.times[over]) / statistics.median(self.times[name])


def counting_faults(step, counts: list[int]):
    """`step`, appending the minor page faults of each call to `counts`."""

    def counted(index: int) -> None:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step(index)
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    return counted


def measure(
    size: str, precision: str, steps: int, warmup: int, workdir: Path, cache: Path, compile: bool = False, offset: int = 0, only: list[str] | None = None
) -> Measured:
    """Each contender's (or `only` those named) step seconds over `steps` alternating rounds after `warmup` ones,
    with the step's tokens and FLOPs."""
    trainer, cfg = build_trainer(size, precision, steps + warmup, workdir / f"{size}-{precision}")
    m, dtype = cfg.model, trainer.autocast_dtype
    torch.manual_seed(0)
    plain = PlainLlama(m.vocab_size, m.dim, m.n_layers, m.n_heads, m.n_kv_heads, m.mlp_hidden, m.max_seq_len)
    hf = hf_llama(m)
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True) for name, model in (("plain", plain), ("transformers", hf))}
    # Every contender reads its batch when it steps, from the same data (a plain loop has to read one too).
    batches = lambda step: trainer.data.batch("train", step, 0, BATCH[size])  # noqa: E731
    contenders = {
        "curryTrain": lambda step: trainer.train_step(),
        "plain": lambda step: hand_step(plain, optimizers["plain"], batches(step), dtype, lambda model, x: model(x)),
        "transformers": lambda step: hand_step(hf, optimizers["transformers"], batches(step), dtype, lambda model, x: model(input_ids=x).logits),
    }
    if compile:
        compiled, _ = build_trainer(
            size, precision, steps + warmup, workdir / f"{size}-{precision}-compile", "trainer.compile=true", f"trainer.compile_cache={cache}"
        )
        plain_compiled = torch.compile(copy.deepcopy(plain))  # what a plain-PyTorch user writes
        optimizers["plain+compile"] = torch.optim.AdamW(plain_compiled.parameters(), lr=1e-3, fused=True)
        contenders["curryTrain+compile"] = lambda step: compiled.train_step()
        contenders["plain+compile"] = lambda step: hand_step(plain_compiled, optimizers["plain+compile"], batches(step), dtype, lambda model, x: model(x))
    for name in set(only or ()) & {"split", "split+compile"}:  # built only where asked for (not in the table)
        torch.manual_seed(0)
        model = PlainLlama(m.vocab_size, m.dim, m.n_layers, m.n_heads, m.n_kv_heads, m.mlp_hidden, m.max_seq_len, block=SplitBlock)
        model = torch.compile(model) if name == "split+compile" else model
        optimizers[name] = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        contenders[name] = lambda step, model=model, name=name: hand_step(model, optimizers[name], batches(step), dtype, lambda model, x: model(x))
    faults: dict[str, list[int]] = {name: [] for name in contenders if name in (only or TABLE)}
    times = alternating_step_times({name: counting_faults(contenders[name], faults[name]) for name in faults}, rounds=steps, warmup=warmup, offset=offset)
    tokens = BATCH[size] * cfg.data.seq_len
    roofline = matmul_roofline(1024, dtype or torch.float32, torch.device("cpu"))
    flops = model_flops_per_token(trainer.model, m.n_layers, m.dim, cfg.data.seq_len) * tokens
    trainer.loggers.close()
    if compile:
        compiled.loggers.close()
    return Measured(times, faults, tokens, flops / roofline)


ROUNDS = {"tiny": 3.0, "small": 1.0, "medium": 0.5}
"""Timed rounds per repeat, times --steps (at least 3): tiny's ~20 ms steps get three times as many (their
medians are the noisiest), medium's ~2 s ones half (with a third, 3 rounds, one disturbed step moved a repeat's
median: medium fp32 compiled 0.977x (0.961-1.095) in one table, 1.069x (1.040-1.119) with 5 rounds)."""


TABLE = ["curryTrain", "plain", "transformers", "curryTrain+compile", "plain+compile"]
CONTENDERS = [*TABLE, "split", "split+compile"]
"""With --only also: plain's Llama with its projections apart (SplitBlock), eager and compiled."""
BASELINE = {"curryTrain": "plain", "transformers": "plain", "curryTrain+compile": "plain+compile"}
"""Each contender's speed is compared with plain PyTorch's in the same mode."""


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}x ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=sorted(BATCH))
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=10, help="timed rounds per repeat (tiny: three times as many, medium: half)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="add the compiled contenders (minutes of compilation on 2 cores)")
    parser.add_argument("--only", nargs="+", choices=CONTENDERS, help="step only these contenders (a row needs curryTrain's and its baseline)")
    parser.add_argument("--faults", action="store_true", help="also print each contender's minor page faults per step (each repeat's median)")
    args = parser.parse_args()
    if args.only and not args.compile and any(name.endswith("+compile") for name in args.only):
        parser.error("--only names a compiled contender: add --compile")
    print(f"threads={torch.get_num_threads()}, {args.repeats} repeats of {args.steps} alternating rounds after {args.warmup} warm-up ones\n")
    print("| size | precision | mode | curryTrain tok/s | plain tok/s | curryTrain / plain | transformers / plain | MFU curryTrain / plain |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        for size in args.sizes:
            steps = max(3, round(ROUNDS[size] * args.steps))
            for precision in args.precisions:
                # Each cell's compiled contenders get graphs for its shapes alone, as a run does: dynamo, seeing
                # the same functions at a second shape, would compile every later cell with dynamic shapes.
                torch._dynamo.reset()
                runs = [
                    measure(
                        size, precision, steps, args.warmup, Path(workdir) / str(r), Path(workdir) / "cache", args.compile, r * (steps + args.warmup), args.only
                    )
                    for r in range(args.repeats)
                ]
                rate = {name: statistics.median(run.rate(name) for run in runs) for name in runs[0].times}
                mfu = {name: statistics.median(run.mfu(name) for run in runs) for name in runs[0].times}
                ratios = {name: [run.speedup(name, base) for run in runs] for name, base in BASELINE.items() if name in rate and base in rate}
                for ours in ("curryTrain", "curryTrain+compile"):
                    if ours not in ratios:
                        continue
                    base, eager = BASELINE[ours], ours == "curryTrain"
                    others = spread(ratios["transformers"]) if eager and "transformers" in ratios else "-"
                    print(
                        f"| {size} | {precision} | {'eager' if eager else 'compiled'} | {rate[ours]:,.0f} | {rate[base]:,.0f} | {spread(ratios[ours])} "
                        f"| {others} | {mfu[ours]:.1%} / {mfu[base]:.1%} |",
                        flush=True,
                    )
                for ours, split in (("curryTrain", "split"), ("curryTrain+compile", "split+compile")):
                    if ours in rate and split in rate:
                        print(f"<!-- {size} {precision} {ours} / {split}: {spread([run.speedup(ours, split) for run in runs])} -->")
                if args.faults:
                    faults = {name: "/".join(f"{statistics.median(run.faults[name]):,.0f}" for run in runs) for name in rate}
                    print(
                        f"<!-- {size} {precision} minor page faults per step, each repeat's median: "
                        + ", ".join(f"{n} {f}" for n, f in faults.items())
                        + " -->"
                    )


if __name__ == "__main__":
    main()
