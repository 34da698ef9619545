"""The task set shipped with curryTrain (currytrain/eval/tasks/), made from the embedded corpus: lines of the standard
library's .py files held out by data=bytes' default split (seed 0), so a run on the default corpus is scored on
files it did not train on. Three lm-evaluation-harness tasks, each a task YAML over a local JSONL file:

- curry_nextline (multiple_choice): two lines of code; which of four lines comes next (acc, acc_norm)?
- curry_complete (generate_until): a line and the first half of the next; generate the rest of that line
  (exact_match against the line's true end, stopping at the newline);
- curry_perplexity (loglikelihood_rolling): whole passages; word_perplexity, byte_perplexity, bits_per_byte.

    python -m currytrain.eval.synthetic                 # rewrite currytrain/eval/tasks/ (the same files, same Python)
    python -m currytrain.eval.synthetic --out DIR       # a copy elsewhere

The lines depend on the interpreter's standard library: tasks/source.json records the Python version they were
made from (tests/test_eval.py regenerates them when this interpreter's version is that one). Every request fits the
default model's context of 128 bytes (lines of at most 40 and 60 characters).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import sysconfig
from pathlib import Path

from currytrain.data.files import plan_split

SEED = 0
NUM_NEXTLINE = 100
NUM_COMPLETE = 50
NUM_PASSAGES = 20
PASSAGE_CHARS = 1200
CHOICES = 4
NEXTLINE_CHARS = 40
"""The longest line of curry_nextline: two of context and the longest choice fit in 128 bytes."""
COMPLETE_CHARS = 60
"""The longest line of curry_complete: a line, half the next and max_gen_toks (32) fit in 128 bytes."""
DEFAULT_OUT = Path(__file__).resolve().parent / "tasks"

METRIC = "  - metric: {name}\n    aggregation: {aggregation}\n    higher_is_better: {better}\n"

NEXTLINE_YAML = """# Which line of Python comes next? Written by `python -m currytrain.eval.synthetic` (docs/evaluation.md).
task: curry_nextline
tag: curry
dataset_path: json
dataset_kwargs:
  data_files:
    test: nextline.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: context
doc_to_choice: choices
doc_to_target: label
target_delimiter: ""
metric_list:
{metrics}metadata:
  version: 1.0
"""

COMPLETE_YAML = """# Complete a line of Python. Written by `python -m currytrain.eval.synthetic` (docs/evaluation.md).
task: curry_complete
tag: curry
dataset_path: json
dataset_kwargs:
  data_files:
    test: complete.jsonl
test_split: test
output_type: generate_until
doc_to_text: context
doc_to_target: target
target_delimiter: ""
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 32
  do_sample: false
metric_list:
{metrics}metadata:
  version: 1.0
"""

PERPLEXITY_YAML = """# Perplexity of whole passages of Python. Written by `python -m currytrain.eval.synthetic` (docs/evaluation.md).
task: curry_perplexity
tag: curry
dataset_path: json
dataset_kwargs:
  data_files:
    test: perplexity.jsonl
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: text
metric_list:
{metrics}metadata:
  version: 1.0
"""


def held_out_files(seed: int = SEED) -> list[Path]:
    """The standard-library files data=bytes holds out for validation with its defaults and this seed."""
    from currytrain.data.corpus import stdlib_sources

    files = sorted(stdlib_sources(Path(sysconfig.get_paths()["stdlib"])))
    return sorted(plan_split(files, 0.1, 16_000_000, seed).val_files)


def _usable(line: str, longest: int) -> bool:
    return 8 <= len(line) <= longest and line.isascii() and bool(line.strip())


def file_lines(path: Path) -> list[str]:
    return [line.rstrip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]


def windows(files: list[Path], size: int, longest: int) -> list[tuple[int, list[str]]]:
    """Every run of `size` consecutive usable lines (8 to `longest` ASCII characters), with the index of its file."""
    found = []
    for index, path in enumerate(files):
        lines = file_lines(path)
        found += [(index, lines[i : i + size]) for i in range(len(lines) - size + 1) if all(_usable(line, longest) for line in lines[i : i + size])]
    return found


def nextline_docs(files: list[Path], rng: random.Random) -> list[dict]:
    runs = windows(files, 3, NEXTLINE_CHARS)
    pool = [(index, line) for index, lines in runs for line in lines]
    docs = []
    for index, lines in rng.sample(runs, NUM_NEXTLINE):
        answer = lines[2]
        distractors: list[str] = []
        while len(distractors) < CHOICES - 1:
            other, line = rng.choice(pool)
            if other != index and line.strip() != answer.strip() and line not in distractors:
                distractors.append(line)
        choices = [answer, *distractors]
        rng.shuffle(choices)
        docs.append({"context": "\n".join(lines[:2]) + "\n", "choices": choices, "label": choices.index(answer)})
    return docs


def complete_docs(files: list[Path], rng: random.Random) -> list[dict]:
    docs = []
    for _, lines in rng.sample(windows(files, 2, COMPLETE_CHARS), NUM_COMPLETE * 4):
        line = lines[1]
        cut = line.rfind(" ", 0, len(line) // 2 + 1)
        if cut <= len(line) - len(line.lstrip()) or len(line) - cut < 4:  # a cut inside the indent, or little to complete
            continue
        docs.append({"context": lines[0] + "\n" + line[: cut + 1], "target": line[cut + 1 :]})
        if len(docs) == NUM_COMPLETE:
            break
    return docs


def passage_docs(files: list[Path], rng: random.Random) -> list[dict]:
    docs = []
    for path in rng.sample(files, min(len(files), NUM_PASSAGES * 3)):
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.isascii() or len(text) < PASSAGE_CHARS:
            continue
        start = text.find("\n", rng.randrange(len(text) - PASSAGE_CHARS)) + 1
        end = text.rfind("\n", start, start + PASSAGE_CHARS)
        if end - start > PASSAGE_CHARS // 2:
            docs.append({"text": text[start:end]})
        if len(docs) == NUM_PASSAGES:
            break
    return docs


def _metrics(*names: tuple[str, str, bool]) -> str:
    return "".join(METRIC.format(name=n, aggregation=a, better=str(b).lower()) for n, a, b in names)


def write_task_set(out: Path, seed: int = SEED) -> list[Path]:
    """Write the three tasks (YAML + JSONL each) and source.json into `out`; returns the files written."""
    files = held_out_files(seed)
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    tasks = {
        "nextline": (NEXTLINE_YAML.format(metrics=_metrics(("acc", "mean", True), ("acc_norm", "mean", True))), nextline_docs(files, rng)),
        "complete": (COMPLETE_YAML.format(metrics=_metrics(("exact_match", "mean", True))), complete_docs(files, rng)),
        "perplexity": (
            PERPLEXITY_YAML.format(
                metrics=_metrics(
                    ("word_perplexity", "weighted_perplexity", False),
                    ("byte_perplexity", "weighted_perplexity", False),
                    ("bits_per_byte", "bits_per_byte", False),
                )
            ),
            passage_docs(files, rng),
        ),
    }
    written = []
    for name, (config, docs) in tasks.items():
        (out / f"{name}.yaml").write_text(config)
        (out / f"{name}.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
        written += [out / f"{name}.yaml", out / f"{name}.jsonl"]
    source = {"python": sys.version.split()[0], "seed": seed, "held_out_files": len(files), "documents": {name: len(docs) for name, (_, docs) in tasks.items()}}
    (out / "source.json").write_text(json.dumps(source, indent=2) + "\n")
    return [*written, out / "source.json"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder to write (default {DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    for path in write_task_set(args.out, args.seed):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
