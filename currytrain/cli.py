"""The `currytrain` console script: the actions that are not one training run (launch.py runs those).

    currytrain init DIR [--copy-framework] [--force]   a new project (conf/ adds to curryTrain's config tree)
    currytrain scaffold NAME [--kind lm|classifier|custom] [--from gqa]   a new idea inside a project
    currytrain hf import SRC [--out DIR]     a Hugging Face checkpoint (folder or Hub id) -> curryTrain folder
    currytrain hf export RUN OUTDIR          a curryTrain run or import folder -> Hugging Face folder

Each subcommand imports its machinery only when it runs, so `currytrain --help` stays instant.
A typed outcome (currytrain.errors) prints one message and exits with its code: 2 for a user error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from currytrain.errors import Outcome


def _hf_import(args: argparse.Namespace) -> None:
    from currytrain.hf import import_hf

    out = import_hf(args.src, args.out, revision=args.revision, overwrite=args.overwrite)
    print(f"imported {args.src} -> {out} (model.yaml + model.safetensors)")


def _hf_export(args: argparse.Namespace) -> None:
    from currytrain.hf import export_hf

    out = export_hf(args.run, args.outdir, dtype=args.dtype, overwrite=args.overwrite)
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
    save.set_defaults(handler=_hf_export)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="currytrain", description="curryTrain actions besides training (python launch.py trains).")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_project(commands)
    _add_hf(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        args.handler(args)
    except Outcome as error:  # a config error (2), a failed gate (3), an abort (4): one message, no traceback
        print(f"curryTrain: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
