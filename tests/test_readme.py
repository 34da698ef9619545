"""The README's "What you type" block, walked as written at tiny sizes: every `python launch.py` and `torchrun` line
composes and validates with its overrides; the single-process runs among them train (TINY sizes, in this process);
every `currytrain` line runs, on the run folder and the project those lines made. What is only validated needs
several processes, a cluster, a GPU or minutes (the multiruns, parallel layouts, SLURM, compile, the ladder); each of
those has its own tests. `currytrain hf import` needs a Hugging Face folder: tests/test_hf.py makes and imports one; `currytrain data
prepare|verify` need a tokenizer and a corpus: tests/test_data_prepare.py makes both and runs them."""

from __future__ import annotations

import contextlib
import re
import shlex
from pathlib import Path

import pytest

from conftest import ROOT, TINY, compose_tiny, launch
from currytrain.cli import main as currytrain_main
from currytrain.validate import validate
from inprocess import project_imports

RUN = {
    "python launch.py",
    "python launch.py --cfg job",
    "python launch.py model=moe",
    "python launch.py data=text data.paths=[my_corpus/]",
    "python launch.py model.ac=full model.mup=true",
    "python launch.py experiment=tiny_bytes",
    "python launch.py hydra.run.dir=runs/a trainer.resume=auto",
    "python launch.py abort=strict trainer.checkpoint_every=50",
}
"""The README lines that train here (the others are composed and validated)."""
NOT_RUN = {
    "currytrain hf import path/to/hf_model",
    "currytrain data prepare data=tokens data.tokenizer=runs/tok data.paths=[corpus/]",
    "currytrain data verify data=tokens data.tokenizer=runs/tok data.paths=[corpus/]",
}
TINY_ONLY = {"experiment=digits"}
"""Lines whose model is not a decoder: TINY's decoder sizes do not apply; they compose at their own sizes."""
CONTEXT = ["model.max_seq_len=128"]
"""The decoders' context here: room for the eval tasks' prompts (as tests/test_eval.py gives them)."""
AT_TINY_SIZES = {"bench": [*TINY, "--steps", "2", "--warmup", "1"], "eval": ["seq_len=128", "limit=2"]}
"""What the currytrain lines add here: bench's step at TINY sizes; eval's context and a few questions per task."""


def readme_lines() -> list[str]:
    block = re.search(r"## What you type\n\n```\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S).group(1)
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def local(line: str, tmp: Path) -> list[str]:
    """The line's arguments, its example paths pointing into the test's folder."""
    places = {"runs/a": tmp / "a", "out/hf_model": tmp / "hf_model", "my_project": tmp / "my_project", "runs/multirun/2026-12-03/10-00-00": tmp / "a"}
    args = [str(places.get(arg, arg)) for arg in shlex.split(line)]
    return [arg.replace("runs/a", str(tmp / "a")).replace("my_corpus/", f"{tmp / 'my_corpus'}/") for arg in args]


@pytest.mark.slow
def test_the_readme_commands_work_as_written_at_tiny_sizes(tmp_path, monkeypatch, capsys):
    lines = readme_lines()
    assert len(lines) > 30 and all(line.startswith(("python launch.py", "torchrun", "currytrain")) for line in lines), lines
    (tmp_path / "my_corpus").mkdir()
    (tmp_path / "my_corpus" / "notes.md").write_text("the README's own words, many times over. " * 400)
    (tmp_path / "my_corpus" / "more.txt").write_text("some more words to learn. " * 300)
    for line in lines:
        args = local(line, tmp_path)
        if line.startswith(("python launch.py", "torchrun")):
            after = args[args.index("launch.py") + 1 :]
            flags = after[: after.index("job") + 1] if "--cfg" in after else [a for a in after if a.startswith("-")]  # --cfg job, -m
            overrides = [a for a in after if a not in flags]
            if "-m" in flags:  # a sweep's values: its first job's config is the one validated
                overrides = [re.sub(r"=([^\[{][^,]*),.*$", r"=\1", a) for a in overrides]
            problems = validate(compose_tiny(*overrides, tiny=False))  # as written: validation trains nothing
            assert problems == [], f"{line}: {problems}"
            if line in RUN:
                run_dir = (
                    []
                    if any(a.startswith("hydra.run.dir=") for a in overrides) or flags
                    else [f"hydra.run.dir={tmp_path / 'runs' / str(len(list(tmp_path.glob('runs/*'))))}"]
                )
                tiny = not any(a in TINY_ONLY for a in overrides)
                sizes = CONTEXT if tiny else []
                result = launch(*(["--cfg=job"] if "--cfg" in flags else flags), *sizes, *overrides, *run_dir, "logger=[jsonl]", tiny=tiny)
                assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
        elif line not in NOT_RUN:
            command = args[1:] + AT_TINY_SIZES.get(args[1], [])
            where = tmp_path / "my_project" if args[1] == "scaffold" else ROOT  # "inside it", as the README says
            monkeypatch.chdir(where)
            with project_imports(where) if where != ROOT else contextlib.nullcontext():
                code = currytrain_main(command)
            monkeypatch.chdir(ROOT)
            assert code == 0, f"{line}\n{capsys.readouterr().err[-3000:]}"
    assert (tmp_path / "hf_model" / "config.json").is_file() and (tmp_path / "my_project" / "experiments" / "my_idea" / "model.py").is_file()
