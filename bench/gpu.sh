#!/usr/bin/env bash
# The GPU benchmark: tokens/s and MFU of a ~1B-parameter GQA model (dim 2048, 18 layers, 16 heads / 4 kv heads,
# SwiGLU 5632, vocab 32000, seq 2048: 0.94B parameters) on one GPU, through `currytrain bench` (the run's own
# build_components and run_accumulated_step). One table, in about 2 minutes on an H200 (cold compile included):
#
#   bash bench/gpu.sh                 # needs a CUDA torch in .venv
#   PY=python3 bash bench/gpu.sh      # another interpreter that has curryTrain's dependencies
#   bash bench/gpu.sh --smoke         # the same pipeline at tiny dims on the CPU, to check the script itself
#   MODEL="model.dim=3072 ... model.ac=full" bash bench/gpu.sh   # another shape (docs/performance.md: the 3B row)
#
# Rows: bf16 eager; bf16 + trainer.compile (one graph: one process, model whole); bf16 + compile under
# parallel=fsdp on this one GPU (fully_shard per block, blocks compiled apart); trainer.precision=fp8 + compile
# (torchao float8, rowwise; needs `pip install 'currytrain[fp8]'` and compute capability 8.9+). MFU is against the
# bf16 matmul roofline `currytrain bench` measures in the same process, and against the card's dense bf16 peak
# (PEAK_TFLOPS, default 989: H100/H200 SXM). Then the fp8 recipe's loss: LOSS_STEPS (200) steps of the same model
# on the byte corpus in bf16 + compile and in fp8 + compile, and their final train losses.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
STEPS=${STEPS:-10}
MODEL=${MODEL:-"model.dim=2048 model.n_layers=18 model.n_heads=16 model.n_kv_heads=4 model.mlp_hidden=5632 model.vocab_size=32000 model.max_seq_len=2048"}
RUN="data=synthetic trainer.batch_size=4 trainer.precision=bf16 trainer.device=cuda"
COMPILE=true
LOSS_STEPS=${LOSS_STEPS:-200}
LOSS_RUN="trainer.batch_size=4 trainer.device=cuda trainer.eval_every=100000 trainer.log_every=10 trainer.progress=false logger=[jsonl]"
if [[ "${1:-}" == "--smoke" ]]; then
    MODEL="model/size=tiny"
    RUN="data=synthetic trainer.batch_size=4 trainer.device=cpu"
    LOSS_RUN="trainer.batch_size=4 trainer.device=cpu trainer.eval_every=100000 trainer.log_every=2 trainer.progress=false logger=[jsonl] data.max_bytes=300000"
    STEPS=2
    LOSS_STEPS=4
    COMPILE=false  # no C++ compiler needed for the smoke run
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
run() {  # name, overrides...
    local name=$1
    shift
    echo "[$(date +%T)] $name" >&2
    "$PY" -m currytrain.cli bench $MODEL $RUN "$@" --steps "$STEPS" --warmup 3 --json >"$OUT/$name.json"
}
run eager trainer.compile=false
run compile trainer.compile=$COMPILE
run fsdp_compile parallel=fsdp parallel.nproc=1 trainer.compile=$COMPILE
run fp8_compile trainer.precision=fp8 trainer.compile=$COMPILE
for precision in bf16 fp8; do  # the fp8 recipe's loss against bf16's, same model, data and seed
    echo "[$(date +%T)] loss $precision, $LOSS_STEPS steps" >&2
    "$PY" launch.py $MODEL $LOSS_RUN trainer.precision=$precision trainer.compile=$COMPILE trainer.max_steps=$LOSS_STEPS \
        trainer.compile_cache="$OUT/cache" hydra.run.dir="$OUT/loss_$precision" >/dev/null
done
"$PY" - "$OUT" "$PEAK_TFLOPS" <<'PYTHON'
import json, sys
from pathlib import Path

out, peak = Path(sys.argv[1]), float(sys.argv[2]) * 1e12
print(f"{'run':<14}{'tokens/s':>12}{'step ms':>10}{'TFLOP/s':>10}{'MFU (roofline)':>16}{'MFU (peak)':>12}{'warm-up s':>11}{'peak GiB':>10}")
for name in ("eager", "compile", "fsdp_compile", "fp8_compile"):
    r = json.loads((out / f"{name}.json").read_text())
    achieved = r["achieved_flops_per_s"]
    print(
        f"{name:<14}{r['tokens_per_s']:>12,.0f}{r['step_seconds']['median'] * 1e3:>10.1f}{achieved / 1e12:>10.1f}"
        f"{r['mfu']:>16.1%}{achieved / peak:>12.1%}{r['warmup_seconds']:>11.1f}{r['peak_memory_bytes'] / 2**30:>10.1f}"
    )
print(f"model {r['config']}, {r['tokens_per_step']} tokens/step, roofline {r['roofline_flops_per_s'] / 1e12:.0f} TFLOP/s, {r['dtype']} on {r['device']}")
rates = {name: json.loads((out / f"{name}.json").read_text())["tokens_per_s"] for name in ("compile", "fp8_compile")}
losses = {}
for precision in ("bf16", "fp8"):
    rows = [json.loads(line) for line in (out / f"loss_{precision}" / "metrics.jsonl").read_text().splitlines()]
    losses[precision] = [row["train/loss"] for row in rows if "train/loss" in row][-1]
print(
    f"fp8 + compile / bf16 + compile: {rates['fp8_compile'] / rates['compile']:.3f}x tokens/s; final train loss "
    f"bf16 {losses['bf16']:.4f}, fp8 {losses['fp8']:.4f} ({losses['fp8'] / losses['bf16'] - 1:+.2%})"
)
PYTHON
