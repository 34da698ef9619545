"""Typed configs of the eval group (conf/eval/): evaluators run on the live model every eval.every steps and at the
end of training, and by `currytrain eval` on any checkpoint (docs/evaluation.md).

Two kinds of evaluator, any number of each:
- held-out text sets (eval.texts, name -> file or folder): token-weighted loss and bits per byte;
- lm-evaluation-harness tasks (eval.tasks) from local task YAMLs over local JSON/Parquet data, through curryTrain's
  LM adapter: the shipped task set (currytrain/eval/tasks/) and the folders of eval.task_paths.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

from currytrain.rules import bounded

SHIPPED_TASKS = ("curry_nextline", "curry_complete", "curry_perplexity")
"""The task set shipped with curryTrain (currytrain/eval/tasks/, written by currytrain.eval.synthetic)."""


@dataclass
class NoEvalConfig:
    """eval=none: no evaluator beyond the trainer's own val loss (every trainer.eval_every steps)."""

    _target_: str | None = None


@dataclass
class EvalConfig:
    """Held-out text sets and lm-evaluation-harness tasks, evaluated in the loop and by `currytrain eval`."""

    _target_: str = "currytrain.eval.runner.Evaluators"
    every: int = bounded("${trainer.eval_every}", ge=0, example=400)
    """Run the evaluators every this many optimizer steps, and after the last; 0: after the last step only."""
    texts: dict[str, str] = field(default_factory=dict)
    """Held-out text sets, name -> a text file or a folder of them (.txt, .md, .py, .jsonl with a `text` field; each
    file one document), scored with the run's tokenizer: eval/<name>/loss (nats per token) and
    eval/<name>/bits_per_byte."""
    tasks: list[str] = field(default_factory=list)
    """lm-evaluation-harness tasks by name (or tag): the shipped ones (curry_nextline, curry_complete,
    curry_perplexity) and those in eval.task_paths. Needs `pip install 'currytrain[eval]'`."""
    task_paths: list[str] = field(default_factory=list)
    """Folders of lm-eval task YAMLs (searched recursively, after which the shipped set); each task must read local
    data (dataset_path: json, parquet, csv, text or arrow with dataset_kwargs.data_files relative to its YAML)."""
    limit: int = bounded(0, ge=0)
    """Documents per task at most (the first ones); 0: all."""
    num_fewshot: int | None = bounded(None, ge=0, example=0)
    """Few-shot examples per prompt for every task; null: each task's own num_fewshot (else 0)."""
    batch_size: int = bounded(8, ge=1)
    """Sequences per forward pass (per data-parallel rank)."""
    max_new_tokens: int = bounded(32, ge=1)
    """Tokens a generate_until task may generate when its generation_kwargs set no max_gen_toks."""
    seq_len: int = bounded(0, ge=0)
    """The context of every evaluator (tokens): text sets are scored in windows of it, and a task prompt longer than it
    is an error. 0: the run's data.seq_len (for an import folder after training: its model.max_seq_len)."""
    max_tokens: int = bounded(65536, ge=0)
    """Tokens scored per held-out text set at most (its first documents); 0: all of them."""
    seed: int = bounded(1234, ge=0, lt=2**31)
    """Seeds lm-eval's few-shot sampling and any sampled generation, the same at every evaluation."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        """Text sets exist and are text; tasks are found locally, read local data, and lm-eval is installed."""
        from currytrain.eval.tasks_local import task_problems, text_set_problems

        problems = text_set_problems(node.texts, f"{path}.texts")
        if not node.texts and not node.tasks:
            problems.append(
                f"{path}: no evaluator: pass {path}.tasks=[curry_nextline] (a task) or {path}.texts={{NAME: FILE}} (a held-out text set), or eval=none"
            )
        if node.tasks:
            if importlib.util.find_spec("lm_eval") is None:
                problems.append(f"{path}.tasks={list(node.tasks)} runs lm-evaluation-harness, which is not installed: pip install 'currytrain[eval]'")
            else:
                problems += task_problems(list(node.tasks), list(node.task_paths), path)
        return problems
