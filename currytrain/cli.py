"""The `currytrain` console script: the actions that are not one training run (launch.py runs those).

    currytrain init DIR [--copy-framework] [--force]   a new project (conf/ adds to curryTrain's config tree)
    currytrain scaffold NAME [--kind lm|classifier|custom] [--from gqa]   a new idea inside a project
    currytrain hf import SRC [--out DIR]     a Hugging Face checkpoint (folder or Hub id) -> curryTrain folder
    currytrain hf export RUN OUTDIR          a curryTrain run or import folder -> Hugging Face folder
    currytrain journal RUN [--plot]          a run's journal as a timeline (and its curves.png)
    currytrain verify RUN                    each checkpoint against its checksums (exit 1 if one fails)
    currytrain compare RUN_OR_SWEEP [...]    runs grouped by config, paired/Welch verdicts with p, report.md
    currytrain diagnose RUN [--json]         what went wrong, and the fix (a multirun: each SLURM job's state)
    currytrain bench [RUN] [overrides] [--json]    tokens/s, MFU and the step's split for a config
    currytrain estimate [RUN] [overrides] [--tokens T] [--gpu h100]   FLOPs, time, device-hours and money of a run
    currytrain advise [RUN] [overrides] [--gpus N]   per-rank memory and traffic of parallel layouts
    currytrain generate RUN --prompt TEXT    text from a run's latest checkpoint or an import (KV cache, streamed)
    currytrain eval RUN [tasks=[...]]        the eval group's evaluators on a run's checkpoint or an import
    currytrain data prepare|verify [overrides]   tokenize a corpus once before the runs | check its cache in full

Run inside a project (`currytrain init`), each command sees it as its launch.py does: its conf/ (experiment=NAME)
and its experiments package (currytrain.conf.enter_app). RUN: a run folder, whose resolved.yaml replaces composing.

Each subcommand imports its machinery only when it runs, so `currytrain --help` stays instant.
A typed outcome (currytrain.errors) prints one message and exits with its code: 2 for a user error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from currytrain.errors import ConfigError, Outcome, RunFailed

if TYPE_CHECKING:
    from omegaconf import DictConfig


def _hf_import(args: argparse.Namespace) -> None:
    from currytrain.hf import import_hf
    from currytrain.hf.finetune import EXPERIMENT, finetune_command

    out = import_hf(args.src, args.out, revision=args.revision, overwrite=args.overwrite)
    print(f"imported {args.src} -> {out} (model.yaml + model.safetensors)")
    print(f"fine-tune it on your text ({out / EXPERIMENT}):\n  {finetune_command(out)}")


def _hf_export(args: argparse.Namespace) -> None:
    from currytrain.config import register_configs
    from currytrain.hf import export_hf

    register_configs()  # the project's classes a run folder's model may name (an idea scaffolded --from gqa)
    out = export_hf(args.run, args.outdir, dtype=args.dtype, overwrite=args.overwrite, max_shard_size=args.max_shard_size)
    print(f"exported {args.run} -> {out} (config.json + model.safetensors): transformers.AutoModelForCausalLM.from_pretrained('{out}')")


def _init(args: argparse.Namespace) -> None:
    from currytrain.project.init import init_project

    written = init_project(args.dir, force=args.force, copy_framework=args.copy_framework)
    print(f"created the project {args.dir} ({len(written)} files). Next:\n  cd {args.dir}\n  python launch.py trainer.max_steps=5\n  pytest")


def _scaffold(args: argparse.Namespace) -> None:
    from currytrain.project.scaffold import scaffold

    written = scaffold(args.name, kind=args.kind, family=args.family, start=Path.cwd())
    for path in written:
        print(f"wrote {path}")
    print(f"train it: python launch.py experiment={args.name}   test it: pytest tests/test_{args.name}.py")


def _add_project(commands: argparse._SubParsersAction) -> None:
    from currytrain.project.scaffold import FAMILIES, KINDS

    init = commands.add_parser("init", help="make a new project whose conf/ adds to curryTrain's config tree (docs/getting-started.md)")
    init.add_argument("dir", type=Path, help="the project folder: new or empty")
    init.add_argument("--copy-framework", action="store_true", help="copy curryTrain's source into the project to edit it, instead of depending on it")
    init.add_argument("--force", action="store_true", help="write into a folder that is not empty, replacing files of the same names")
    init.set_defaults(handler=_init)

    scaffold = commands.add_parser("scaffold", help="add an idea to the project around the current folder: model, data, configs and a test")
    scaffold.add_argument("name", help="the experiment's name: a Python identifier not used yet (experiment=NAME)")
    scaffold.add_argument("--kind", choices=KINDS, default="lm", help="lm: a causal LM; classifier: one label per sequence; custom: the bare contract")
    scaffold.add_argument("--from", dest="family", choices=FAMILIES, default=None, help="start the model from a copy of a built-in family (kind lm)")
    scaffold.set_defaults(handler=_scaffold)


def _add_hf(commands: argparse._SubParsersAction) -> None:
    hf = commands.add_parser("hf", help="convert weights from and to Hugging Face transformers (docs/hf.md)")
    actions = hf.add_subparsers(dest="action", required=True, metavar="{import,export}")

    load = actions.add_parser("import", help="a HF checkpoint -> model.yaml + model.safetensors in curryTrain names")
    load.add_argument("src", help="a local folder with config.json and *.safetensors, or a Hub id such as org/name")
    load.add_argument("--out", default=None, help="output folder (default: runs/hf/<name of SRC>)")
    load.add_argument("--revision", default=None, help="Hub branch, tag or commit (default: main)")
    load.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    load.set_defaults(handler=_hf_import)

    save = actions.add_parser("export", help="a run folder (latest complete checkpoint) or import folder -> HF folder")
    save.add_argument("run", help="a run folder, one of its checkpoints/step_N folders, or an import folder")
    save.add_argument("outdir", help="output folder for config.json + model.safetensors")
    save.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None, help="cast the weights (default: as stored)")
    save.add_argument("--overwrite", action="store_true", help="replace OUTDIR if it exists")
    save.add_argument("--max-shard-size", default="5GB", help="larger weights are split into shards of at most this size, with an index (default: 5GB)")
    save.set_defaults(handler=_hf_export)


def _journal(args: argparse.Namespace) -> None:
    from currytrain.journal import read_journal, timeline
    from currytrain.report.runs import JOURNAL

    path = Path(args.run).expanduser()
    path = path / JOURNAL if path.is_dir() else path
    if not path.is_file():
        raise ConfigError(f"{args.run} has no {JOURNAL}: pass a run folder or its journal file")
    print("\n".join(timeline(read_journal(path))))
    if args.plot:
        from currytrain.report.figure import plot_run

        figure = plot_run(path.parent)
        print(f"figure: {figure}" if figure else f"no figure: {path} logged fewer than 2 steps")


def _verify(args: argparse.Namespace) -> None:
    from currytrain.checkpoint import metadata_problem
    from currytrain.weights import STEP_DIR, checkpoint_problem, is_complete

    run = Path(args.run).expanduser()
    folder = run if STEP_DIR.match(run.name) else run / "checkpoints"
    if not folder.is_dir():
        raise ConfigError(f"{args.run} has no checkpoints/ folder: pass a run folder or one of its checkpoints/step_N")
    paths = [folder] if folder.name != "checkpoints" else sorted((p for p in folder.iterdir() if STEP_DIR.match(p.name)), key=lambda p: int(p.name[5:]))
    problems = {path: checkpoint_problem(path) or (metadata_problem(path) if is_complete(path) else None) for path in paths}
    for path, problem in problems.items():
        print(f"{path.name}: {'ok' if problem is None else problem}")
    if not paths:
        print(f"{folder}: no checkpoints")
    bad = [path.name for path, problem in problems.items() if problem]
    if bad:
        raise RunFailed(f"{len(bad)} of {len(paths)} checkpoints cannot be loaded ({', '.join(bad)}); trainer.resume=auto falls back to the newest intact one")


def _compare(args: argparse.Namespace) -> None:
    from currytrain.report.compare import compare, summary

    found = compare(args.runs, args.out, args.metric, args.direction, args.baseline, args.alpha, args.delta, args.test)
    for group in found.groups:
        print(f"{group.name}: {len(group.runs)} run(s), final {found.metric} {summary(group)}")
    for line in found.lines:
        print(f"  -> {line}")
    print(f"report: {found.report}")


def _diagnose(args: argparse.Namespace) -> None:
    from currytrain.cluster.slurm import JOBS_RECORD
    from currytrain.report.diagnose import diagnose, diagnose_jobs, find_first_nan_module

    folder = Path(args.run).expanduser()
    if not (folder / "journal.jsonl").is_file() and (folder / JOBS_RECORD).is_file():  # a multirun of SLURM jobs
        jobs = diagnose_jobs(folder)
        print(json.dumps([job.as_dict() for job in jobs], indent=2) if args.json else "\n".join(line for job in jobs for line in job.lines()))
        return
    if not (folder / "journal.jsonl").is_file():
        raise ConfigError(
            f"{args.run} is not a run folder (no journal.jsonl) nor a multirun folder of SLURM jobs (no {JOBS_RECORD}): pass one of them to diagnose"
        )
    findings = diagnose(args.run)
    nan = next((f for f in findings if f.cause == "nan"), None)
    if args.anomaly and nan is not None:
        from currytrain.config import register_configs

        register_configs()  # the schemas that type the run's config, and the registered components it may build
        located = find_first_nan_module(args.run, max_steps=nan.step or 1)
        if located:
            nan.summary += f"; re-run with forward hooks: module `{located[1]}` gave the first non-finite output, at step {located[0]}"
    if args.json:
        print(json.dumps([finding.as_dict() for finding in findings], indent=2))
        return
    for finding in findings:
        print(f"{finding.cause}: {finding.summary}\n  fix: {finding.fix}")


def run_or_composed(overrides: list[str]) -> DictConfig:
    """The config a command reads: the resolved.yaml of a run folder given first (the `key=value` overrides after it
    applied), else the config `python launch.py OVERRIDES` runs, composed in the project this command runs in. A run
    folder's config is read as untrusted data (no interpolations, its own build.allow dropped) and typed by the
    schemas of the project this command runs in, as a launch's config is (validate then checks it)."""
    from currytrain.config import compose_config, register_configs

    if not overrides or not Path(overrides[0]).expanduser().is_dir():
        return compose_config(overrides)
    from omegaconf import DictConfig, OmegaConf

    from currytrain.conf import enter_app
    from currytrain.validate import raise_on_problems, typed_run_config
    from currytrain.weights import RESOLVED, read_yaml_mapping

    run = Path(overrides[0]).expanduser()
    if not (run / RESOLVED).is_file():
        raise ConfigError(f"{overrides[0]} is a folder without {RESOLVED}: pass a run folder (python launch.py writes one), or launch.py overrides")
    enter_app()  # the project's schemas and experiments, as composing would see them
    register_configs()
    data = read_yaml_mapping(run / RESOLVED)
    data["build"] = {"allow": []}  # what a run folder allows is not the reader's to trust
    cfg, problems = typed_run_config(data)
    raise_on_problems(problems)
    for change in overrides[1:]:
        key = change.partition("=")[0]
        if "=" not in change or OmegaConf.select(cfg, key, default=None) is None or isinstance(OmegaConf.select(cfg, key), DictConfig):
            raise ConfigError(
                f"{change}: after a run folder, pass key=value overrides of values its {RESOLVED} holds (e.g. trainer.batch_size=16); "
                "a group choice (model=moe) needs a composed config: drop the run folder"
            )
        OmegaConf.update(cfg, key, OmegaConf.select(OmegaConf.from_dotlist([change]), key), merge=False)
    return cfg


def _bench(args: argparse.Namespace) -> None:
    from currytrain.benchmark import step_benchmark
    from currytrain.validate import raise_on_problems, validate

    cfg = run_or_composed(args.overrides)
    raise_on_problems(validate(cfg) + _one_process_problems(cfg))
    result = step_benchmark(cfg, steps=args.steps, warmup=args.warmup)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    step, split = result["step_seconds"], result["split_seconds"]
    print(
        f"{result['config']['model']} dim {result['config']['dim']} x {result['config']['n_layers']} layers, seq {result['config']['seq_len']}, {result['dtype']} on {result['device']} ({result['threads']} threads)"
    )
    if result["compile"]:
        print(f"compiled: the {args.warmup} warm-up steps took {result['warmup_seconds']:.1f} s (compilation included)")
    print(f"step: median {step['median'] * 1e3:.1f} ms (min {step['min'] * 1e3:.1f}, max {step['max'] * 1e3:.1f}) over {result['steps']} steps")
    print(f"tokens/s: {result['tokens_per_s']:,.0f}   model FLOPs/token: {result['model_flops_per_token']:,.0f}")
    print(f"MFU: {result['mfu']:.1%} of a {result['roofline_flops_per_s'] / 1e9:,.0f} GFLOP/s matmul roofline measured now")
    print(f"split: forward {split['forward'] * 1e3:.1f} ms, backward {split['backward'] * 1e3:.1f} ms, optimizer {split['optimizer'] * 1e3:.1f} ms")
    print(f"peak memory: {result['peak_memory_bytes'] / 2**20:,.0f} MiB")


def _one_process_problems(cfg) -> list[str]:
    """currytrain bench steps one process: a layout of several would be timed as one, unparallelized."""
    from currytrain.parallel.dims import launched_world_size

    world = launched_world_size(cfg.parallel.nproc)
    if world == 1:
        return []
    return [
        f"currytrain bench times one process, and parallel.nproc={cfg.parallel.nproc} asks for {world}: pass parallel=single "
        "(or parallel.nproc=1); for several workers time whole runs with bench/dp_throughput.py"
    ]


def _estimate(args: argparse.Namespace) -> None:
    from currytrain.config import compose_config
    from currytrain.cost.estimate import estimate_cost
    from currytrain.validate import raise_on_problems, validate

    cfg = run_or_composed(args.overrides)
    if args.gpu:  # the cost option, composed alone: a run folder's resolved.yaml holds the one it ran with
        cfg.cost = compose_config([f"cost={args.gpu}"]).cost
    raise_on_problems(validate(cfg))
    estimate = estimate_cost(cfg, args.tokens)
    print(json.dumps(estimate.as_dict(), indent=2) if args.json else estimate.describe())


def _data(args: argparse.Namespace) -> None:
    from omegaconf import OmegaConf

    from currytrain.config import compose_config
    from currytrain.data.sources import prepare_data, verify_data
    from currytrain.validate import check_tree, raise_on_problems, unreadable_values

    cfg = compose_config(args.overrides)
    raise_on_problems(unreadable_values(cfg.data, "data") or check_tree(cfg.data, "data"))  # the model's sizes do not matter here
    fields = OmegaConf.to_container(cfg.data, resolve=True)
    print("\n".join((prepare_data if args.action == "prepare" else verify_data)(fields)))


def _add_data(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="prepare a corpus's token cache once, before the runs, or verify it (docs/data.md)")
    actions = data.add_subparsers(dest="action", required=True, metavar="{prepare,verify}")
    for action, text in (
        ("prepare", "tokenize data.paths (or data.sources) into the token cache, resuming a killed preparation, mending a damaged cache"),
        ("verify", "check every shard's checksum and hash every input byte against the cache's records (exit 2 on a problem)"),
    ):
        parser = actions.add_parser(action, help=text)
        parser.add_argument("overrides", nargs="*", help="launch.py overrides, e.g. data=tokens data.tokenizer=runs/tok data.paths=[corpus/]")
        parser.set_defaults(handler=_data)


def _add_estimate(commands: argparse._SubParsersAction) -> None:
    estimate = commands.add_parser("estimate", help="FLOPs, time, device-hours and money of a run before it runs")
    estimate.add_argument("overrides", nargs="*", help="launch.py overrides, e.g. model/size=small cost.num_devices=8; or a run folder first")
    estimate.add_argument("--tokens", type=float, default=None, help="tokens to train (default: the run's max_steps x batch x seq_len)")
    estimate.add_argument("--gpu", default=None, help="the cost option to price on (conf/cost/: h100, a100, cpu); same as cost=NAME")
    estimate.add_argument("--json", action="store_true", help="print the estimate as JSON")
    estimate.set_defaults(handler=_estimate)


def _advise(args: argparse.Namespace) -> None:
    from currytrain.advise import advise, parse_bytes, print_advice
    from currytrain.estimate import device_memory
    from currytrain.parallel.dims import launched_world_size
    from currytrain.validate import raise_on_problems, validate

    cfg = run_or_composed(args.overrides)
    raise_on_problems(validate(cfg))  # the model it builds (on the meta device) names a registered class
    world = args.gpus or launched_world_size(cfg.parallel.nproc)
    memory = parse_bytes(args.gpu_mem) if args.gpu_mem else device_memory(cfg.trainer.device)[0]
    result = advise(cfg, world, memory)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print_advice(result)


def _add_runs(commands: argparse._SubParsersAction) -> None:
    advise = commands.add_parser("advise", help="predict per-rank memory and communication of parallel layouts, and what to add next")
    advise.add_argument("overrides", nargs="*", help="launch.py overrides, e.g. model/size=small data.seq_len=4096; or a run folder first")
    advise.add_argument("--gpus", type=int, default=0, help="ranks to plan for (default: the config's world size)")
    advise.add_argument("--gpu-mem", default=None, help="memory per rank, e.g. 80GiB (default: this machine's device or RAM)")
    advise.add_argument("--json", action="store_true", help="print the predictions as JSON")
    advise.set_defaults(handler=_advise)

    bench = commands.add_parser("bench", help="time training steps of a config: tokens/s, MFU, forward/backward/optimizer split")
    bench.add_argument("overrides", nargs="*", help="launch.py overrides, e.g. model/size=small trainer.precision=bf16; or a run folder first")
    bench.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    bench.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    bench.add_argument("--json", action="store_true", help="print the result as JSON (schema in docs/performance.md)")
    bench.set_defaults(handler=_bench)

    journal = commands.add_parser("journal", help="print a run's journal as a readable timeline")
    journal.add_argument("run", help="a run folder (or its journal.jsonl)")
    journal.add_argument("--plot", action="store_true", help="also draw curves.png beside the journal: train and val loss, lr, grad norm, tokens/s")
    journal.set_defaults(handler=_journal)

    verify = commands.add_parser("verify", help="check a run's checkpoints against the checksums written when they were saved")
    verify.add_argument("run", help="a run folder (or one of its checkpoints/step_N)")
    verify.set_defaults(handler=_verify)

    compare = commands.add_parser("compare", help="compare runs, seeds and sweeps: better/worse/equivalent/inconclusive with test, n and p")
    compare.add_argument("runs", nargs="+", help="run folders, multirun folders or sweep folders, in any mix")
    compare.add_argument("--out", default=None, help="folder for report.md and curves.png (default: compare/ in the runs' common parent)")
    compare.add_argument(
        "--metric", default="val_loss", help="the final value compared (default val_loss; any journaled metric: train/loss, eval/<task>/<metric>)"
    )
    compare.add_argument(
        "--direction",
        default=None,
        choices=["minimize", "maximize"],
        help="whether lower or higher is better (default: as the runs' evaluations journal it for an eval/ metric, else minimize)",
    )
    compare.add_argument("--baseline", default=None, help="the group the others are judged against, by its printed name or a run folder (default: the first)")
    compare.add_argument("--alpha", type=float, default=0.05, help="significance level (0.01 for a claim worth a headline)")
    compare.add_argument("--delta", type=float, default=None, help="equivalence margin in the metric's unit: 'equivalent within ±delta' by TOST")
    compare.add_argument("--test", default="t", choices=["t", "wilcoxon"], help="the paired test where groups share seeds (Welch's t otherwise)")
    compare.set_defaults(handler=_compare)

    diagnose = commands.add_parser("diagnose", help="name what went wrong in a run, and the fix")
    diagnose.add_argument("run", help="a run folder, or a multirun folder of SLURM jobs (hydra/launcher=slurm)")
    diagnose.add_argument("--json", action="store_true", help="print the findings as JSON")
    diagnose.add_argument("--anomaly", action="store_true", help="for a NaN: re-run to the first bad step with hooks and name the module")
    diagnose.set_defaults(handler=_diagnose)


def _generate(args: argparse.Namespace) -> None:
    from currytrain.config import register_configs
    from currytrain.eval.commands import read_prompts, run_generate
    from currytrain.eval.generate import Sampling

    register_configs()  # the project's classes a run folder's model may name
    temperature = 0.0 if args.greedy else args.temperature
    sampling = Sampling(args.max_new_tokens, temperature, args.top_k, args.top_p, args.seed)
    prompts = read_prompts(args.prompt, args.prompts_file)
    run_generate(args.run, prompts, sampling, tokenizer=args.tokenizer, device=args.device, as_json=args.json)


def _add_generate(commands: argparse._SubParsersAction) -> None:
    generate = commands.add_parser("generate", help="generate text from a run's latest checkpoint or an import folder (docs/evaluation.md)")
    generate.add_argument("run", help="a run folder (its latest complete checkpoint), a checkpoint folder or a `currytrain hf import` folder")
    generate.add_argument("--prompt", action="append", default=[], help="the text to continue (repeat for several prompts)")
    generate.add_argument("--prompts-file", default=None, help="a file of prompts: one a line (\\n for a newline), or .jsonl records with a 'prompt'")
    generate.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    generate.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8); 0 is greedy")
    generate.add_argument("--greedy", action="store_true", help="the most likely token each time (same as --temperature 0)")
    generate.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (default 0: all)")
    generate.add_argument("--top-p", type=float, default=1.0, help="sample among the most likely tokens holding this probability (default 1: all)")
    generate.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0): same seed, same text")
    generate.add_argument("--tokenizer", default=None, help="a tokenizer.json or a folder holding one (default: the run's data tokenizer, or bytes)")
    generate.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    generate.add_argument("--json", action="store_true", help="print one JSON record a prompt (text, token ids, why it stopped, tokens/s)")
    generate.set_defaults(handler=_generate)


def _eval(args: argparse.Namespace) -> None:
    from currytrain.config import compose_config
    from currytrain.eval.commands import eval_overrides, run_eval
    from currytrain.validate import check_tree, raise_on_problems

    cfg = compose_config(eval_overrides(args.overrides))
    raise_on_problems(check_tree(cfg.eval, "eval"))
    metrics = run_eval(args.run, cfg.eval, tokenizer=args.tokenizer, device=args.device, out=args.out)
    if args.json:
        print(json.dumps(metrics, indent=2))
        return
    width = max(map(len, metrics), default=0)
    for name, value in metrics.items():
        print(f"{name:<{width}}  {value:.6g}")


def _add_eval(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser("eval", help="run the eval group's evaluators on a run's latest checkpoint or an import (docs/evaluation.md)")
    evaluate.add_argument("run", help="a run folder (its latest complete checkpoint), a checkpoint folder or a `currytrain hf import` folder")
    evaluate.add_argument("overrides", nargs="*", help="eval group overrides: eval=synthetic (default), tasks=[curry_nextline], limit=50, +texts.NAME=FILE")
    evaluate.add_argument("--tokenizer", default=None, help="a tokenizer.json or a folder holding one (default: the run's data tokenizer, or bytes)")
    evaluate.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    evaluate.add_argument("--out", default=None, help="also write results.json and report.md into this folder (an import folder's results go nowhere else)")
    evaluate.add_argument("--json", action="store_true", help="print the metrics as JSON")
    evaluate.set_defaults(handler=_eval)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="currytrain", description="curryTrain actions besides training (python launch.py trains).")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_project(commands)
    _add_hf(commands)
    _add_runs(commands)
    _add_estimate(commands)
    _add_generate(commands)
    _add_eval(commands)
    _add_data(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    from currytrain.conf import enter_app

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "overrides", None), list) and not any(arg.startswith("-") for arg in extra):
        args.overrides += extra  # overrides after an option (`eval RUN --tokenizer T tasks=[x]`): argparse leaves them over
    elif extra:
        parser.parse_args(argv)  # argparse's own message for what no command takes, exit 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    enter_app()  # every command sees the project it runs in, as its launch.py does: its experiments and conf/
    try:
        args.handler(args)
    except Outcome as error:  # a config error (2), a failed gate (3), an abort (4): one message, no traceback
        message = str(error)  # a config's problems come formatted, with the prefix already
        print(message if message.startswith("curryTrain: ") else f"curryTrain: {message}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
