"""The bodies of `currytrain generate` and `currytrain eval` (currytrain/cli.py parses their arguments)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from currytrain.errors import ConfigError
from currytrain.eval.generate import Sampling, generate, new_token_budget
from currytrain.eval.source import Source, load_source


@dataclass
class Generated:
    """One prompt's generation."""

    prompt: str
    text: str
    tokens: list[int]
    prompt_tokens: int
    stopped: str
    """Why it ended: stop_token, max_new_tokens or context."""
    seconds: float

    def as_dict(self) -> dict:
        return {**self.__dict__, "tokens_per_s": len(self.tokens) / self.seconds if self.seconds > 0 else None}


def read_prompts(prompts: list[str], prompts_file: str | None) -> list[str]:
    """--prompt values, then the prompts of --prompts-file: one a line (\\n inside a line is a newline), or a
    .jsonl file of {"prompt": ...} records."""
    found = list(prompts)
    if prompts_file is None:
        return found
    path = Path(prompts_file).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"--prompts-file {prompts_file} does not exist: pass a text file with one prompt a line, or a .jsonl file of {{'prompt': ...}} records"
        )
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                found.append(str(json.loads(line)["prompt"]))
            except (ValueError, KeyError, TypeError):
                raise ConfigError(f"--prompts-file {path}:{number} is not a JSON object with a 'prompt' field: fix that line") from None
        else:
            found.append(line.replace("\\n", "\n"))
    return found


def prompt_ids(source: Source, prompt: str) -> list[int]:
    """The prompt's token ids; an empty prompt starts from the codec's document start (its EOS or newline)."""
    ids = source.codec.encode(prompt)
    if not ids and source.codec.prefix_id is not None:
        ids = [source.codec.prefix_id]
    if not ids:
        raise ConfigError("the prompt is empty and the tokenizer names no EOS or BOS token to start from: pass a non-empty --prompt")
    if source.context is not None and len(ids) >= source.context:
        raise ConfigError(
            f"the prompt has {len(ids)} tokens and the model's context is {source.context} (model.max_seq_len), which leaves no room for a new token: "
            "pass a shorter --prompt"
        )
    return ids


def generate_one(source: Source, prompt: str, sampling: Sampling, show: Callable[[str], None] = lambda _: None) -> Generated:
    """Generate after one prompt, calling show(text) with each piece of new text as it is whole."""
    ids = prompt_ids(source, prompt)
    stream, tokens = source.codec.stream(), []
    started = time.perf_counter()
    for token in generate(source.model, ids, sampling, context=source.context, stop_ids=source.codec.stop_ids):
        tokens.append(token)
        if token not in source.codec.stop_ids:
            show(stream.push(token))
    show(stream.finish())
    seconds = time.perf_counter() - started
    if tokens and tokens[-1] in source.codec.stop_ids:
        stopped = "stop_token"
    elif len(tokens) < sampling.max_new_tokens:
        stopped = "context"
    else:
        stopped = "max_new_tokens"
    text = source.codec.decode([t for t in tokens if t not in source.codec.stop_ids])
    return Generated(prompt, text, tokens, len(ids), stopped, seconds)


def run_generate(
    location: str,
    prompts: list[str],
    sampling: Sampling,
    *,
    tokenizer: str | None = None,
    device: str = "cpu",
    as_json: bool = False,
    out: TextIO | None = None,
) -> list[Generated]:
    """`currytrain generate`: each prompt's text streamed to `out` (or one JSON record a prompt with as_json)."""
    problems = sampling.problems()
    if not prompts:
        problems.append("no prompt: pass --prompt TEXT (several times for several) or --prompts-file FILE")
    if problems:
        raise ConfigError("; ".join(problems))
    source = load_source(location, tokenizer, device)
    out = out or sys.stdout
    results = []
    for index, prompt in enumerate(prompts):
        if as_json:
            result = generate_one(source, prompt, sampling)
            out.write(json.dumps(result.as_dict()) + "\n")
        else:
            if index:
                out.write("\n---\n")
            out.write(prompt)
            out.flush()
            result = generate_one(source, prompt, sampling, show=lambda text: (out.write(text), out.flush()))
            out.write("\n")
            if result.stopped == "context":
                budget = new_token_budget(result.prompt_tokens, sampling, source.context)
                out.write(f"[stopped after {budget} new tokens: the model's context is {source.context} tokens (model.max_seq_len)]\n")
        results.append(result)
    out.flush()
    return results


# ---------------------------------------------------------------------------------------------- currytrain eval

EVAL_FIELDS = ("every", "texts", "tasks", "task_paths", "limit", "num_fewshot", "batch_size", "max_new_tokens", "seq_len", "max_tokens", "seed")
"""The eval group's fields, which `currytrain eval` takes without their eval. prefix (tasks=[...] is eval.tasks=[...])."""


def eval_overrides(args: list[str]) -> list[str]:
    """The Hydra overrides of `currytrain eval`: eval=OPTION and eval.* as they are, a bare field prefixed with eval.
    (tasks=[a,b], +texts.wiki=FILE), and eval=synthetic first when no option is chosen."""
    found = []
    for arg in args:
        sign = arg[: len(arg) - len(arg.lstrip("+~"))]
        key = arg[len(sign) :].split("=", 1)[0]
        if key.split(".")[0] in EVAL_FIELDS:
            arg = f"{sign}eval.{arg[len(sign) :]}"
        elif key != "eval" and not key.startswith("eval."):
            raise ConfigError(
                f"currytrain eval takes overrides of the eval group, not {arg}: pass eval=OPTION or one of {list(EVAL_FIELDS)} (tasks=[curry_nextline])"
            )
        found.append(arg)
    chosen = any(arg.split("=", 1)[0] == "eval" for arg in found)
    return found if chosen else ["eval=synthetic", *found]


def run_eval(location: str, node, *, tokenizer: str | None = None, device: str = "cpu", out: str | None = None) -> dict[str, float]:
    """`currytrain eval`: the evaluators of `node` (the composed eval group) on the model at `location`. A run's
    results are journaled (an `evaluation` event naming the checkpoint) and put in its report.md; with `out`, a
    results.json and report.md go there too."""
    from currytrain.build import build
    from currytrain.eval.live import LiveModel
    from currytrain.eval.runner import record, write_report
    from currytrain.eval.source import run_config, section
    from currytrain.journal import Journal, current, read_journal
    from currytrain.parallel.state import ParallelState, resolve_device

    if node.get("_target_") is None:
        raise ConfigError("eval=none runs no evaluator: pass eval=synthetic, or tasks=[...] / +texts.NAME=FILE")
    source = load_source(location, tokenizer, device)
    path = Path(location).expanduser()
    config = run_config(path)
    evaluators = build(node)
    seq_len = section(config, "data").get("seq_len") or source.context
    context = evaluators.context(seq_len)
    if source.context is not None and context > source.context:
        raise ConfigError(f"eval.seq_len={context} exceeds the model's context (model.max_seq_len={source.context}): pass seq_len={source.context} or less")
    live = LiveModel(source.model, ParallelState(device=resolve_device(device)), None, context)
    evaluators.prepare(live, source.codec)
    metrics = evaluators.run(live, stderr=True)
    step = source.step or 0
    fields = {"source": "currytrain eval", "weights": str(source.weights)}
    if config is not None:  # a run folder (or one of its checkpoints): its journal and report.md
        run_dir = path if (path / "journal.jsonl").is_file() else path.parent.parent
        journal = Journal(run_dir / "journal.jsonl")
        record(metrics, step, journal, None, evaluators.higher_is_better, **fields)
        write_report(run_dir, [e for e in current(read_journal(run_dir / "journal.jsonl")) if e.get("type") == "evaluation"])
    if out is not None:
        folder = Path(out).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        event = {"type": "evaluation", "step": step, **fields, **metrics, "higher_is_better": evaluators.higher_is_better}
        (folder / "results.json").write_text(json.dumps(event, indent=2) + "\n")
        write_report(folder, [event])
    return metrics
