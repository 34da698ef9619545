"""How often does check=ladder cry wolf on healthy models, and does it name the right cause on broken ones?

    python bench/ladder_calibration.py                        # 5 healthy models x 10 seeds, then the zoo x 3 seeds
    python bench/ladder_calibration.py --seeds 2 --zoo-seeds 1 --budget-minutes 60
    python bench/ladder_calibration.py --part healthy --models gqa plain --stages skeleton preflight sanity
    python bench/ladder_calibration.py --table                # the tables of what has run so far, nothing new

Healthy part: `python launch.py check=ladder seed=S` (every gate, within the ladder's 4-minute budget: the plan cuts
the training stages' steps from the step time it measures) in a process of its own per (model, seed), for: gqa, moe
and spiking (curryTrain's families at their default debug size, on the default corpus), a classifier made by
`currytrain scaffold clf --kind classifier`, and a plain-PyTorch GPT written in this file in the style of nanoGPT
(PLAIN_MODEL: dropout 0.1, blocks in `self.h`, tied readout, its own loss and ignore index, its own parameter groups,
none of curryTrain's layers) put into a project made by `currytrain init` + `currytrain scaffold plain`, as a new
user would; and, with --models scaffold_lm, that project's `currytrain scaffold lm --kind lm` unchanged. Each gate's
(stage's) verdict comes from the run's journal, and the run's wall time and planned step time from it too (the
ladder's cost in units of its own measured step: a ratio that a busy machine inflates less than seconds). Printed:
per gate, the runs, the FAILs (false alarms: every model here is healthy) and the warnings, with their rates; which
findings warned; and each model's ladder time.

Zoo part (in this process, TINY sizes): the first zoo, every bug of tests/ladder_zoo.py and tests/plain_models.py,
and the second, every bug from the public record in tests/public_zoo.py (each planted the way it happened in a
plain-PyTorch GPT or its data adapter), planted in freshly built Components at each seed, the stages climbed in the
ladder's order (skeleton, preflight, sanity, resume, stopping at the first failed gate; the probe stage for a bug
only it can see, beside the healthy control at the same budget). A bug is caught when its probe warns or fails with
the planted cause in its text; the cause is right when, besides, no other finding fails with a cause of its own (a
consequence reported under the bug does not count).

Bounded: results go to --out (default runs/bench/ladder_calibration/) one JSON line per run as it ends, and a
rerun skips what is there, so the bench resumes where it stopped; --budget-minutes stops starting new runs.
--stages climbs some gates only (the cheap ones at many seeds; then every gate at other seeds, --first-seed):
the table counts each gate over every ladder that climbed it.
Runs are in round-robin order (seed 0 of every model, then seed 1, ...), so a cut run still covers every model.
Each subprocess gets OMP_NUM_THREADS=1 (a niced multi-thread process waits on a busy shared core).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it

MODELS = {
    "gqa": ("repo", []),
    "moe": ("repo", ["model=moe"]),
    "spiking": ("repo", ["model=spiking"]),
    "spiking_small": ("repo", ["model=spiking", "model.n_layers=2", "model.timesteps=2"]),
    "classifier": ("project", ["experiment=clf"]),
    "plain": ("project", ["experiment=plain"]),
    "scaffold_lm": ("project", ["experiment=lm"]),
}
"""Healthy model -> (where launch.py runs: curryTrain's checkout or the scaffolded project, its overrides).
spiking_small is the spiking family at 2 layers and 2 timesteps: a full ladder of the debug spiking model takes
over an hour on 2 busy cores, so the every-gate seeds of a bounded run use it. scaffold_lm is
`currytrain scaffold lm --kind lm` unchanged (2 layers of dim 64 on its own arithmetic-runs data): a new user's
first healthy model."""
DEFAULT_MODELS = ["gqa", "moe", "spiking", "classifier", "plain"]

STAGES = ("skeleton", "preflight", "sanity", "resume", "lr_range", "mup", "seeds", "ablation", "probe", "capacity", "scaling")

PLAIN_MODEL = '''"""A GPT in plain PyTorch in the style of nanoGPT (written by bench/ladder_calibration.py): no curryTrain layer,
learned position embeddings, dropout 0.1, blocks in self.h, the readout tied to the token embedding, GPT-2's
depth-scaled init of the residual projections, its own loss with its own ignore index, its own parameter groups."""

import math

import torch
import torch.nn.functional as F
from torch import nn

DROPOUT = 0.1


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.attn_dropout, self.resid_dropout = nn.Dropout(DROPOUT), nn.Dropout(DROPOUT)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_heads)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf")).softmax(-1)
        return self.resid_dropout(self.c_proj((self.attn_dropout(att) @ v).transpose(1, 2).reshape(b, t, d)))


class Block(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, n_heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(DROPOUT))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class {Name}Model(nn.Module):
    IGNORE = -1

    def __init__(self, vocab_size, dim, n_layers, n_heads, max_seq_len):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, dim), nn.Embedding(max_seq_len, dim)
        self.drop = nn.Dropout(DROPOUT)
        self.h = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for block in self.h:  # GPT-2: the projections into the residual stream scaled by 1/sqrt(2 n_layers)
            for proj in (block.attn.c_proj, block.mlp[2]):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * n_layers))

    def forward(self, idx):
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def loss(self, logits, targets):
        targets = targets.reshape(-1)  # (sum, scored targets): the form a step adds up over microbatches and ranks
        total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, ignore_index=self.IGNORE, reduction="sum")
        return total, (targets != self.IGNORE).sum()

    def param_groups(self):
        params = list(self.parameters())
        return [{{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1}}, {{"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}}]
'''


# ------------------------------------------------------------------------------------------------ healthy


def make_project(folder: Path) -> Path:
    """A project as a new user makes one: currytrain init, scaffold a classifier and an lm, the lm's model replaced."""
    project = folder / "project"
    cli = [sys.executable, "-m", "currytrain.cli"]
    if not (project / "launch.py").is_file():
        subprocess.run([*cli, "init", str(project)], check=True, capture_output=True)
    for name, kind in (("clf", "classifier"), ("plain", "lm"), ("lm", "lm")):
        if not (project / "experiments" / name / "model.py").is_file():
            subprocess.run([*cli, "scaffold", name, "--kind", kind], check=True, capture_output=True, cwd=project)
            if name == "plain":
                (project / "experiments" / "plain" / "model.py").write_text(PLAIN_MODEL.format(Name="Plain"))
    return project


def run_ladder(model: str, seed: int, out: Path, project: Path, stages: list[str], timeout: float, clock: str = "wall") -> dict:
    where, overrides = MODELS[model]
    run_dir = out / "healthy" / model / f"seed_{seed}"
    skip = [f"~check.stages.{stage}" for stage in STAGES if stage not in stages]
    cwd = ROOT if where == "repo" else project
    args = [
        sys.executable,
        "launch.py",
        "check=ladder",
        f"seed={seed}",
        "logger=[jsonl]",
        f"hydra.run.dir={run_dir}",
        f"check.plan_clock={clock}",
        *overrides,
        *skip,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    try:
        done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, tail = done.returncode, done.stderr[-2000:]
    except subprocess.TimeoutExpired:
        rc, tail = -1, f"timed out after {timeout:.0f} s"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    record = {"model": model, "seed": seed, "climbed": list(stages), "rc": rc, "seconds": round(time.perf_counter() - started, 1), "stages": {}, "alarms": []}
    record.update(cpu_seconds=round(cpu, 1), clock=clock)
    record["load"] = os.getloadavg()[0]
    journal = run_dir / "journal.jsonl"
    for line in journal.read_text().splitlines() if journal.is_file() else []:
        event = json.loads(line)
        if event.get("type") == "check_plan":
            record["plan"] = {key: event.get(key) for key in ("step_seconds", "factor", "total_seconds", "steps", "clock")}
        if event.get("type") == "check":
            record["stages"][event["stage"]] = event["status"]
            for finding in event["findings"]:
                if finding["status"] in ("warning", "failed"):
                    record["alarms"].append({"stage": event["stage"], **{k: finding[k] for k in ("name", "status", "observed", "cause", "consequence_of")}})
    if rc not in (0, 3):
        record["error"] = tail
    return record


# ------------------------------------------------------------------------------------------------ the zoo

TINY = ["model.dim=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1", "model.mlp_hidden=64", "model.max_seq_len=32"]
TINY += ["trainer.batch_size=4", "trainer.max_steps=6", "data.max_bytes=300000", "logger=[jsonl]", "trainer.progress=false"]


def zoo() -> list[tuple[str, dict]]:
    """(bug, how to plant it and what must catch it): `break_parts(parts, patch)` changes built Components,
    `overrides` the config, `plain` builds tests/plain_models.PlainLM with that bug, `pad` the padded corpus."""
    from tests import ladder_zoo as z

    def planted(probe: str, *words: str, **how) -> dict:
        return {"probe": probe, "words": words, **how}

    first = [
        ("double softmax (skeleton)", planted("outputs are logits", "double softmax", break_parts=lambda p, m: z.double_softmax(p), stop="skeleton")),
        ("double softmax (overfit)", planted("overfit one batch", "double softmax", break_parts=lambda p, m: z.double_softmax(p), only="sanity")),
        ("missing zero_grad", planted("zero_grad between steps", "zero_grad() is missing", step_fn=z.step_without_zero_grad)),
        ("eval mode during training", planted("train/eval mode", "eval mode during training", break_parts=lambda p, m: z.eval_mode_during_training(p))),
        ("dropout left on in eval (readout)", planted("train/eval mode", "active in eval mode", break_parts=lambda p, m: z.dropout_in_eval_mode(p))),
        ("label leaked into the inputs", planted("no label leakage", "labels leak into the inputs", break_parts=lambda p, m: z.label_in_inputs(p))),
        ("non-causal mask", planted("causality", "not causal", break_parts=lambda p, m: z.non_causal_mask(m))),
        ("dead layer (zeroed weights)", planted("gradient flow", "dead layer", break_parts=lambda p, m: z.zeroed_layer(p, index=1))),
        ("detached block", planted("gradient flow", "no gradient reaches", break_parts=lambda p, m: z.detached_block(p, index=1))),
        ("init scale x100", planted("init loss", "init scale", overrides=["model.init_std=2.0"], only="sanity")),
        ("lr x1000", planted("one step lowers the loss", "too high", overrides=["optimizer.lr=3.0"])),
        ("frozen embedding", planted("no frozen parameters", "tok_embeddings.weight", break_parts=lambda p, m: z.frozen_embedding(p))),
        ("val split repeats train", planted("no train/val overlap", "repeats the train data", break_parts=lambda p, m: z.val_is_train(p))),
        ("blocks learn 100x slower (own param groups)", planted("learning rates", "learn that much slower", plain="slow_blocks")),
        ("a norm hides vanishing gradients", planted("layer gradients", "vanish", plain="norm_hides_vanishing")),
        ("padding counted in the loss (data adapter)", planted("no label leakage", "padding counted", pad=False)),
        ("functional dropout left on in eval (blocks)", planted("train/eval mode", "active in eval mode", plain="eval_dropout")),
        ("parameter missing from its own groups", planted("optimizer coverage", "param_groups() leaves them out", plain="missing_from_optimizer")),
        ("gradient reversal (update of the wrong sign)", planted("one step lowers the loss", "does not descend at any lr", plain="gradient_reversal")),
        ("loss of the wrong sign (own loss)", planted("loss sign", "wrong sign", plain="negated_loss")),
    ]
    from tests import public_zoo

    second = [(f"{bug.name} ({bug.source.split(':')[0]})", planted(bug.probe, *bug.words, public=bug.name)) for bug in public_zoo.BUGS.values()]
    return first + second


PROBE_CASE = {"tasks": ["copy"], "max_steps": 150, "batch_size": 32, "seq_len": 32, "gate": False, "restarts": 0}
"""The probe stage as check=ladder runs it, without the restart: a bug the probe stage names meets it once."""


def public_parts(cfg, bug: str, state, **model):
    """Components around tests/public_zoo.py's control carrying `bug`, seeded by cfg.seed."""
    import torch

    from currytrain.build import build
    from currytrain.components import build_components
    from tests import public_zoo

    torch.manual_seed(cfg.seed)
    gpt, data_bug = public_zoo.build(bug, **model)
    return build_components(cfg, state, data=public_zoo.documents(build(cfg.data), data_bug), model=gpt)


def zoo_model_config(cfg, **node):
    """`cfg` resolved, its model node replaced by tests/public_zoo.py's GPT with `node` (what sub-runs build)."""
    from omegaconf import OmegaConf

    from currytrain.build import allow_targets

    OmegaConf.resolve(cfg)
    OmegaConf.set_struct(cfg, False)
    cfg.model = OmegaConf.create({"_target_": "tests.public_zoo.GPT", "ac": "none", "ac_policy": "block", "ac_every": 2, **node})
    cfg.build.allow = ["tests.public_zoo.GPT"]
    allow_targets(cfg.build.allow)  # what build.allow=[tests.public_zoo.GPT] on a command line does in its process
    return cfg


def run_probe_case(name: str, bug: str, seed: int, out: Path, findings: list) -> dict:
    """A bug only the probe stage sees: the bug and the healthy control (same position encoding) at the same budget."""
    from currytrain.check.probe_tasks import Probe
    from currytrain.check.stage import StageContext
    from currytrain.config import compose_config
    from currytrain.journal import Journal
    from currytrain.parallel.state import ParallelState

    control = {}
    for arm, arm_bug in (("bug", bug), ("control", "")):
        cfg = zoo_model_config(
            compose_config(["data.max_bytes=300000", f"seed={seed}", "logger=[jsonl]"]), bug=arm_bug, positions="rope", dim=64, n_heads=4, max_len=128
        )
        run_dir = out / "zoo" / name.replace(" ", "_").replace("/", "_") / f"seed_{seed}" / arm
        ctx = StageContext(cfg, ParallelState(), run_dir, Journal(run_dir / "journal.jsonl", enabled=False))
        result = Probe(**PROBE_CASE).run(ctx)
        (findings if arm == "bug" else control.setdefault("findings", [])).extend(("probe", f) for f in result.findings)
    return control


def run_zoo_case(name: str, how: dict, seed: int, out: Path) -> dict:
    import pytest
    import torch

    from currytrain.build import build
    from currytrain.check.ladder import remember
    from currytrain.check.preflight import Preflight
    from currytrain.check.resume import Resume
    from currytrain.check.sanity import Sanity
    from currytrain.check.skeleton import Skeleton
    from currytrain.check.stage import Stage, StageContext, Status
    from currytrain.components import build_components
    from currytrain.config import compose_config
    from currytrain.journal import Journal
    from currytrain.parallel.state import ParallelState
    from tests import plain_models, public_zoo

    cfg = compose_config([*TINY, f"seed={seed}", *how.get("overrides", [])])
    run_dir = out / "zoo" / name.replace(" ", "_").replace("/", "_") / f"seed_{seed}"
    ctx = StageContext(cfg, ParallelState(), run_dir, Journal(run_dir / "journal.jsonl", enabled=False))
    torch.manual_seed(seed)
    findings, control = [], {}
    public = how.get("public")
    if public and public_zoo.BUGS[public].stage == "probe":
        control = run_probe_case(name, public, seed, out, findings)
        return zoo_record(name, how, seed, findings, control)
    if public:
        parts = public_parts(cfg, public, ctx.state)
    else:
        data = build(cfg.data)
        if "pad" in how:
            data = plain_models.padded(data, declare_pad=how["pad"])
        model = plain_models.PlainLM(bug=how["plain"]) if "plain" in how else None
        parts = build_components(cfg, ctx.state, data=data, model=model)
    stages: list[Stage] = [Skeleton(), Preflight(), Sanity()]
    if public:
        resume = Resume()
        resume.build = lambda config, state: public_parts(config, public, state)
        stages.append(resume)
    if "only" in how:
        stages = [stage for stage in stages if stage.name == how["only"]]
    with pytest.MonkeyPatch.context() as patch:
        if "break_parts" in how:
            how["break_parts"](parts, patch)
        for stage in stages:
            if "step_fn" in how and hasattr(stage, "step_fn"):
                stage.step_fn = how["step_fn"]
            if public and stage.needs_components:  # each stage gets fresh parts, as the ladder's stages do (ctx.build())
                parts = public_parts(cfg, public, ctx.state)
            result = stage.run(ctx) if stage.needs_components is False else stage.assess(parts, ctx)
            remember(ctx, result)
            findings += [(stage.name, f) for f in result.findings]
            if result.status is Status.FAILED or how.get("stop") == stage.name:
                break
    return zoo_record(name, how, seed, findings, control)


def zoo_record(name: str, how: dict, seed: int, findings: list, control: dict) -> dict:
    """Caught: the planted probe warns or fails with the planted words in its cause. Right cause: besides, no other
    finding fails with a cause of its own, and a healthy control at the same budget (when there is one) passes."""
    from currytrain.check.stage import Status

    hit = [f for _, f in findings if f.name == how["probe"] and f.status in (Status.WARNING, Status.FAILED)]
    caught = bool(hit) and all(word in hit[0].cause for word in how["words"])
    rivals = [f"{s}: {f.name}: {f.cause[:120]}" for s, f in findings if f.status is Status.FAILED and f.name != how["probe"] and not f.consequence_of]
    alarms = [f"control: {f.name}: {f.observed[:120]}" for _, f in control.get("findings", []) if f.status in (Status.WARNING, Status.FAILED)]
    record = {"bug": name, "seed": seed, "caught": caught, "right_cause": caught and not rivals and not alarms, "rivals": rivals + alarms}
    record["cause"] = hit[0].cause[:200] if hit else ""
    if not hit:  # what the ladder said instead: why it was not caught
        record["seen"] = [f"{s}: {f.name} {f.status.value}: {f.observed[:100]}" for s, f in findings if f.status is not Status.PASSED][:6]
    return record


# ------------------------------------------------------------------------------------------------ tables


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def healthy_table(records: list[dict]) -> str:
    runs, fails, warns, skips = Counter(), Counter(), Counter(), Counter()
    models = defaultdict(set)
    which: dict[str, Counter] = defaultdict(Counter)
    for record in records:
        for stage, status in record["stages"].items():
            runs[stage] += 1
            models[stage].add(record["model"])
            fails[stage] += status == "failed"
            warns[stage] += status == "warning"
            skips[stage] += status == "skipped"
        for alarm in record["alarms"]:
            which[alarm["stage"]][f"{alarm['name']} ({alarm['status']}, {record['model']})"] += 1
    crashed = [f"{r['model']} seed {r['seed']}: rc {r['rc']}" for r in records if r["rc"] not in (0, 3)]
    timing = time_table(records)
    seeds = Counter(r["model"] for r in records)
    full = Counter(r["model"] for r in records if tuple(r.get("climbed", STAGES)) == STAGES)
    lines = [
        f"healthy ladders: {len(records)} ({', '.join(f'{m} x{n}' for m, n in sorted(seeds.items()))}), of which every gate: "
        f"{sum(full.values())} ({', '.join(f'{m} x{n}' for m, n in sorted(full.items()))}); crashed or timed out: {len(crashed)} {crashed}",
        "",
        "| gate (stage) | runs | models | false FAILs | rate | warnings | rate | skipped |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for stage in STAGES:
        n = runs[stage]
        if n:
            lines.append(
                f"| {stage} | {n} | {len(models[stage])} | {fails[stage]} | {fails[stage] / n:.0%} | {warns[stage]} | {warns[stage] / n:.0%} | {skips[stage]} |"
            )
    alarms = [f"- {stage}: {text} x{count}" for stage in STAGES for text, count in which[stage].most_common()]
    return "\n".join(lines + (["", "Which findings raised them:", *alarms] if alarms else []) + ["", *timing])


def time_table(records: list[dict]) -> list[str]:
    """Per model and plan clock, over the ladders that climbed every gate: the median wall and CPU time (the ladder
    process's, one thread), the plan's total and step time, the ladder's cost in those steps (on the plan's clock: what
    a busier machine inflates least), and the share of steps the plan kept."""
    import statistics

    rows = ["| model | plan clock | ladders | wall s (median, max) | CPU s (median, max) | planned s | step s | ladder / step | steps kept |"]
    rows.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    by_model: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records:
        if tuple(record.get("climbed", STAGES)) == STAGES and "plan" in record and record["rc"] in (0, 3):
            by_model[record["model"], record.get("clock", "wall")].append(record)
    for (model, clock), runs in sorted(by_model.items()):
        wall = [r["seconds"] for r in runs]
        cpu = [r.get("cpu_seconds", math.nan) for r in runs]
        step = [r["plan"]["step_seconds"] for r in runs]
        ratio = [(r["cpu_seconds"] if clock == "cpu" else r["seconds"]) / r["plan"]["step_seconds"] for r in runs]  # in the plan's clock
        planned = statistics.median(r["plan"]["total_seconds"] for r in runs)
        kept = statistics.median(r["plan"]["factor"] for r in runs)
        rows.append(
            f"| {model} | {clock} | {len(runs)} | {statistics.median(wall):.0f}, {max(wall):.0f} | {statistics.median(cpu):.0f}, {max(cpu):.0f} | {planned:.0f} "
            f"| {statistics.median(step):.3g} | {statistics.median(ratio):.0f} | {kept:.0%} |"
        )
    return rows if len(rows) > 2 else []


def zoo_table(records: list[dict]) -> str:
    by_bug: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_bug[record["bug"]].append(record)
    lines = ["| bug | seeds | caught | right cause |", "|---|---:|---:|---:|"]
    total = caught = right = 0
    for bug, rows in by_bug.items():
        c, r = sum(row["caught"] for row in rows), sum(row["right_cause"] for row in rows)
        total, caught, right = total + len(rows), caught + c, right + r
        lines.append(f"| {bug} | {len(rows)} | {c}/{len(rows)} | {r}/{len(rows)} |")
    if total:
        lines.append(f"| **all {len(by_bug)} bugs** | {total} | {caught / total:.0%} | {right / total:.0%} |")
    wrong = [
        f"- {row['bug']} seed {row['seed']}: {row['rivals'] or row['cause'] or 'not caught: ' + str(row.get('seen'))}"
        for row in records
        if not row["right_cause"]
    ]
    return "\n".join(lines + (["", "Misses and wrong causes:", *wrong] if wrong else []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds per healthy model (first-seed, first-seed + 1, ...)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first healthy seed (a second batch of seeds starts after the first)")
    parser.add_argument("--zoo-seeds", type=int, default=3, help="seeds per zoo bug")
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=list(MODELS))
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES), help="the gates of check=ladder to climb (others removed)")
    parser.add_argument("--part", choices=("healthy", "zoo", "both"), default="both")
    parser.add_argument("--bugs", nargs="+", default=[], help="zoo bugs whose name holds one of these words (default: every bug)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "ladder_calibration")
    parser.add_argument("--budget-minutes", type=float, default=float("inf"), help="start no new run after this many minutes")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds one healthy ladder may take")
    parser.add_argument(
        "--plan-clock",
        choices=("wall", "cpu"),
        default="wall",
        help="check.plan_clock of the healthy ladders: cpu plans the steps a quiet machine would run, whatever the load here",
    )
    parser.add_argument("--table", action="store_true", help="print the tables of the results so far and exit")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    healthy_path, zoo_path = args.out / "healthy.jsonl", args.out / "zoo.jsonl"
    deadline = time.monotonic() + 60 * args.budget_minutes
    if not args.table and args.part in ("zoo", "both"):
        done = {(r["bug"], r["seed"]) for r in read_records(zoo_path)}
        for seed in range(args.zoo_seeds):
            for name, how in zoo():
                if args.bugs and not any(word in name for word in args.bugs):
                    continue
                if (name, seed) not in done and time.monotonic() < deadline:
                    record = run_zoo_case(name, how, seed, args.out)
                    print(f"zoo {name} seed {seed}: caught {record['caught']}, right cause {record['right_cause']}", flush=True)
                    with zoo_path.open("a") as f:
                        f.write(json.dumps(record) + "\n")
    if not args.table and args.part in ("healthy", "both"):
        project = make_project(args.out)
        done = {(r["model"], r["seed"], tuple(r.get("climbed", STAGES)), r.get("clock", "wall")) for r in read_records(healthy_path)}
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for model in args.models:
                if (model, seed, tuple(args.stages), args.plan_clock) in done or time.monotonic() >= deadline:
                    continue
                record = run_ladder(model, seed, args.out, project, args.stages, args.timeout, args.plan_clock)
                status = ", ".join(f"{s} {v}" for s, v in record["stages"].items() if v != "passed")
                print(f"{model} seed {seed}: rc {record['rc']} in {record['seconds']:.0f} s; not passed: {status or 'none'}", flush=True)
                with healthy_path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
    print(f"\n## Healthy models ({healthy_path})\n")
    print(healthy_table(read_records(healthy_path)))
    print(f"\n## The zoo ({zoo_path})\n")
    print(zoo_table(read_records(zoo_path)))


if __name__ == "__main__":
    main()
