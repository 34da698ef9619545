"""The eval group's component: every configured evaluator, prepared once and run on the live model at each
evaluation, in the loop (Trainer) and after training (`currytrain eval`).

prepare() reads the held-out text sets and checks every lm-eval task against the model's context without running it
(a prompt too long, a dataset that cannot be read: a ConfigError before the first step). run() evaluates, in eval
mode with every random state restored afterwards, and returns flat metrics: eval/<set>/loss, eval/<set>/bits_per_byte,
eval/<task>/<metric>. record() sends them to the journal (an `evaluation` event) and the loggers; write_report()
puts the journal's evaluations into the run's report.md.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from currytrain.errors import ConfigError
from currytrain.eval.heldout import TextSet, read_text_sets
from currytrain.eval.live import LiveModel, evaluating
from currytrain.eval.tasks_local import task_configs
from currytrain.eval.text import Codec

log = logging.getLogger(__name__)

OFFLINE = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_EVALUATE_OFFLINE")
"""Set while lm-eval runs: the datasets and hub libraries refuse the network instead of trying it."""
REPORT_BEGIN, REPORT_END = "<!-- curryTrain evaluation: begin -->", "<!-- curryTrain evaluation: end -->"


class Evaluators:
    """Held-out text sets and lm-eval tasks (the EvalConfig fields: docs there)."""

    def __init__(
        self,
        every: int = 0,
        texts: dict[str, str] | None = None,
        tasks: list[str] | None = None,
        task_paths: list[str] | None = None,
        limit: int = 0,
        num_fewshot: int | None = None,
        batch_size: int = 8,
        max_new_tokens: int = 32,
        seq_len: int = 0,
        max_tokens: int = 65536,
        seed: int = 1234,
    ):
        self.every, self.texts, self.tasks, self.task_paths = every, dict(texts or {}), list(tasks or []), list(task_paths or [])
        self.limit, self.num_fewshot, self.batch_size = limit, num_fewshot, batch_size
        self.max_new_tokens, self.seq_len, self.max_tokens, self.seed = max_new_tokens, seq_len, max_tokens, seed
        self.text_sets: list[TextSet] = []
        self.task_configs: list[dict[str, Any]] = []
        self.codec: Codec | None = None
        self.loaded: dict[str, Any] = {}
        self.higher_is_better: dict[str, bool] = {}
        """Whether a larger value is better, per metric of the last run() (what compare decides by)."""
        """lm-eval's loaded tasks ({"tasks", "groups", "group_map"}), made by prepare()."""

    def due(self, step: int) -> bool:
        """Whether the loop evaluates after `step` (the last step's evaluation is the trainer's final one)."""
        return self.every > 0 and step % self.every == 0

    def context(self, run_seq_len: int | None) -> int | None:
        """The evaluators' context: eval.seq_len, else the run's."""
        return self.seq_len or run_seq_len

    def prepare(self, live: LiveModel, codec: Codec) -> None:
        """Read the text sets, load the tasks (their local data read once), and check every task's requests against
        the context without a forward."""
        self.codec = codec
        self.text_sets = read_text_sets(self.texts, codec, self.max_tokens)
        if self.tasks:
            try:
                self.task_configs = task_configs(self.tasks, self.task_paths)
            except ValueError as error:
                raise ConfigError(str(error)) from None
            with offline():
                self.loaded = self._load_tasks()
            self._harness(live, dry=True, stderr=False)
        log.info("evaluators: %d text set(s), %d task(s), context %s tokens", len(self.text_sets), len(self.task_configs), live.context)

    def run(self, live: LiveModel, stderr: bool = False) -> dict[str, float]:
        """Every evaluator on the live model: flat metrics (the lm-eval ones on the first data-parallel rank only).
        stderr: lm-eval's standard errors too (closed-form for means; bootstrapped for the others, in processes)."""
        assert self.codec is not None, "prepare() first"
        metrics: dict[str, float] = {}
        with evaluating(live.model):
            for text_set in self.text_sets:
                metrics.update({f"eval/{text_set.name}/{key}": value for key, value in text_set.evaluate(live, self.batch_size).items()})
                self.higher_is_better.update({f"eval/{text_set.name}/{key}": False for key in ("loss", "bits_per_byte")})
            if self.task_configs:
                metrics.update(self._harness(live, dry=False, stderr=stderr))
        return metrics

    def _load_tasks(self) -> dict[str, Any]:
        """lm-eval's task objects of the local configs (their datasets read here, once), few-shot counts applied."""
        from lm_eval.tasks import TaskManager

        files = {config["task"]: config["__yaml__"] for config in self.task_configs}
        try:
            loaded = TaskManager(include_defaults=False).load([{k: v for k, v in c.items() if k != "__yaml__"} for c in self.task_configs])
        except Exception as error:  # datasets' and lm-eval's errors for a file they cannot read have no common type
            raise ConfigError(
                f"eval.tasks: lm-eval could not load {list(files)} from their local files ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}): "
                f"check each task's YAML and data files ({', '.join(files.values())})"
            ) from None
        for task in loaded["tasks"].values():
            if self.num_fewshot is not None and task.get_config("num_fewshot") != 0:
                task.set_config(key="num_fewshot", value=self.num_fewshot)
            elif task.get_config("num_fewshot") is None:
                task.set_config(key="num_fewshot", value=0)
        return loaded

    def _harness(self, live: LiveModel, dry: bool, stderr: bool) -> dict[str, float]:
        """lm-eval's evaluate on the loaded tasks with curryTrain's LM; every random state seeded by eval.seed first
        (evaluating() puts the training's back), so each evaluation draws the same few-shot examples."""
        with offline():
            from lm_eval.evaluator import evaluate

            from currytrain.eval.lm import CurryTrainLM

            files = {config["task"]: config["__yaml__"] for config in self.task_configs}
            lm = CurryTrainLM(live, self.codec, batch_size=self.batch_size, max_new_tokens=self.max_new_tokens, seed=self.seed, task_files=files, dry=dry)
            random.seed(self.seed)
            np.random.seed(self.seed)
            torch.manual_seed(self.seed)
            for task in self.loaded["tasks"].values():
                task.set_fewshot_seed(seed=self.seed)
            results = evaluate(lm=lm, task_dict=self.loaded, limit=self.limit or None, bootstrap_iters=1000 if stderr else 0, log_samples=False)
        if results is None or dry:
            return {}
        for task, better in results.get("higher_is_better", {}).items():
            self.higher_is_better.update({f"eval/{task}/{name}": bool(value) for name, value in better.items() if value is not None})
        return harness_metrics(results["results"])


def harness_metrics(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """lm-eval's results as flat metrics: {task: {"acc,none": v}} -> {"eval/task/acc": v}; a filter other than
    `none` is kept in the name (acc_strict-match), placeholders ("N/A") are left out."""
    metrics = {}
    for task, values in results.items():
        for key, value in values.items():
            if "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            name, _, filtered = key.partition(",")
            metrics[f"eval/{task}/{name}{'' if filtered == 'none' else '_' + filtered}"] = float(value)
    return metrics


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """The Hugging Face libraries offline for the block (environment and, once imported, their constants)."""
    saved = {key: os.environ.get(key) for key in OFFLINE}
    os.environ.update({key: "1" for key in OFFLINE})
    constants = _offline_constants()
    quiet = _quiet()
    try:
        yield
    finally:
        quiet()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for module, name, value in constants:
            setattr(module, name, value)


def _quiet() -> Any:
    """lm-eval's INFO lines and datasets' progress bars off for the block (an evaluation inside a run is one line a
    metric); returns what turns them back."""
    import datasets
    import lm_eval.api.task as task_module

    lm_logger = logging.getLogger("lm_eval")
    level, bars, bar = lm_logger.level, datasets.is_progress_bar_enabled(), getattr(task_module, "tqdm", None)
    lm_logger.setLevel(logging.WARNING)
    datasets.disable_progress_bars()
    if bar is not None:  # the "Building contexts" bar of every task at every evaluation
        task_module.tqdm = functools.partial(bar, disable=True)

    def restore() -> None:
        lm_logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()
        if bar is not None:
            task_module.tqdm = bar

    return restore


def _offline_constants() -> list[tuple[Any, str, Any]]:
    """Set the offline flags the libraries read at import (when imported already); returns what to put back."""
    import importlib
    import sys

    saved = []
    for module_name, name in (("datasets.config", "HF_DATASETS_OFFLINE"), ("huggingface_hub.constants", "HF_HUB_OFFLINE")):
        if module_name.split(".")[0] not in sys.modules:
            importlib.import_module(module_name)
        module = sys.modules[module_name]
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, True)
    return saved


def record(metrics: dict[str, float], step: int, journal: Any, loggers: Any = None, higher_is_better: dict[str, bool] | None = None, **fields: Any) -> None:
    """The journal's `evaluation` event (and the loggers' metrics) of one evaluation; higher_is_better (per metric)
    is journaled with it, so compare knows which way each goes."""
    if not metrics:
        return
    better = {key: value for key, value in (higher_is_better or {}).items() if key in metrics}
    journal.event("evaluation", step=step, **fields, **metrics, **({"higher_is_better": better} if better else {}))
    if loggers is not None:
        loggers.log_metrics(metrics, step)
    log.info("step %d: %s", step, ", ".join(f"{key} {value:.4g}" for key, value in metrics.items()))


def report_section(evaluations: list[dict[str, Any]]) -> str:
    """The report.md section of a run's evaluations (journal events): the latest of each metric, then the history."""
    if not evaluations:
        return ""
    names = sorted({key for event in evaluations for key in event if key.startswith("eval/")})
    last = evaluations[-1]
    lines = [REPORT_BEGIN, "## Evaluation", "", f"Latest (step {last['step']}{', ' + last['source'] if last.get('source') else ''}):", ""]
    lines += ["| metric | value |", "|---|---|"] + [f"| {name} | {_fmt(last.get(name))} |" for name in names]
    if len(evaluations) > 1:
        lines += ["", "Every evaluation:", "", "| step | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        lines += [f"| {event['step']} | " + " | ".join(_fmt(event.get(name)) for name in names) + " |" for event in evaluations]
    return "\n".join(lines + ["", REPORT_END]) + "\n"


def _fmt(value: Any) -> str:
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) and math.isfinite(value) else str(value)


def write_report(run_dir: Path, evaluations: list[dict[str, Any]]) -> Path:
    """Put the evaluations' section into <run>/report.md, replacing an earlier one and keeping anything else there."""
    path = Path(run_dir) / "report.md"
    text = path.read_text() if path.is_file() else ""
    if REPORT_BEGIN in text and REPORT_END in text:
        text = text[: text.index(REPORT_BEGIN)] + text[text.index(REPORT_END) + len(REPORT_END) :].lstrip("\n")
    section = report_section(evaluations)
    path.write_text((text.rstrip("\n") + "\n\n" if text.strip() else "") + section)
    return path
