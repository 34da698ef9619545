"""The eval group (currytrain/eval/, docs/evaluation.md): held-out text sets scored token-weighted, lm-eval tasks from
local files through curryTrain's adapter, in the loop (journal, loggers, report.md; training unchanged by an eval)
and after (`currytrain eval`), compare on task metrics, the shipped task set, and bad input that exits 2."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("lm_eval")

from conftest import train_losses  # noqa: E402
from currytrain.cli import main  # noqa: E402
from currytrain.errors import ConfigError  # noqa: E402
from currytrain.eval.heldout import TextSet, read_text_sets  # noqa: E402
from currytrain.eval.live import LiveModel  # noqa: E402
from currytrain.eval.runner import Evaluators  # noqa: E402
from currytrain.eval.synthetic import write_task_set  # noqa: E402
from currytrain.eval.tasks_local import SHIPPED_DIR, task_problems  # noqa: E402
from currytrain.eval.text import byte_codec  # noqa: E402
from currytrain.journal import read_journal  # noqa: E402
from currytrain.parallel.state import ParallelState  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

EVAL_RUN = ["logger=[jsonl]", "model.max_seq_len=128", "eval=synthetic", "eval.limit=4", "trainer.max_steps=4", "trainer.eval_every=2"]
"""A tiny run with the shipped tasks on 4 documents each, evaluated at steps 2 and 4 (128 bytes: the tasks' context)."""


def tiny_decoder(seed: int = 0) -> torch.nn.Module:
    from omegaconf import OmegaConf

    from currytrain.model import build_model

    torch.manual_seed(seed)
    node = dict(_target_="currytrain.model.gqa.GQATransformer", vocab_size=256, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, mlp_hidden=64, max_seq_len=128)
    return build_model(OmegaConf.create(node)).eval()


def events(run: Path, kind: str = "evaluation") -> list[dict]:
    return [event for event in read_journal(run / "journal.jsonl") if event.get("type") == kind]


# ------------------------------------------------------------------------------------------ held-out text sets


def test_a_bad_text_set_file_is_named_by_its_eval_key(tmp_path):
    """A held-out .jsonl that is not JSON lines names eval.texts.NAME, the key that points at it, not data.paths."""
    (tmp_path / "held.jsonl").write_text('{"text": "fine"}\n{"text": "cut sho\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^eval.texts.held: .*held.jsonl line 2 is not JSON .* remove it from eval.texts.held$"):
        read_text_sets({"held": str(tmp_path / "held.jsonl")}, byte_codec(), max_tokens=0)


def test_a_text_set_is_scored_token_weighted_in_windows_of_the_context(tmp_path):
    """Every token of every document is scored once (each document from the codec's start id), the loss is the sum
    over tokens divided by their count whatever the batch size (ragged windows: never a mean of batch means), and
    bits per byte is that sum in bits over the text's UTF-8 bytes."""
    texts = ["def f(x):\n    return x + 1\n" * 3, "class A:\n    pass\n", "é" * 7]
    for index, text in enumerate(texts):
        (tmp_path / f"doc{index}.txt").write_text(text, encoding="utf-8")
    model = tiny_decoder()
    codec = byte_codec()
    text_set = TextSet.read("code", str(tmp_path), codec, max_tokens=0)
    stream = [t for text in texts for t in [ord("\n"), *text.encode("utf-8")]]
    assert text_set.tokens.tolist() == stream and text_set.num_bytes == sum(len(t.encode("utf-8")) for t in texts)
    context, first_ids = 16, {sum(len(t.encode("utf-8")) + 1 for t in texts[:i]) for i in range(len(texts))}
    targets = [t if i + 1 not in first_ids else -100 for i, t in enumerate(stream[1:])]  # a document's start id is no text
    with torch.no_grad():  # the reference: each window on its own, summed
        total = sum(
            F.cross_entropy(
                model(torch.tensor([stream[s : min(s + context, len(stream) - 1)]]))[0], torch.tensor(targets[s : s + context]), reduction="sum"
            ).item()
            for s in range(0, len(stream) - 1, context)
        )
    scored = sum(len(t.encode("utf-8")) for t in texts)
    live = LiveModel(model, ParallelState(), None, context)
    results = [text_set.evaluate(live, batch_size) for batch_size in (1, 3, 64)]
    for result in results:
        assert result["tokens"] == scored
        assert math.isclose(result["loss"], total / scored, rel_tol=1e-6)
        assert math.isclose(result["bits_per_byte"], total / math.log(2) / text_set.num_bytes, rel_tol=1e-6)


def test_an_evaluation_leaves_every_random_state_and_the_mode_as_it_found_them(tmp_path):
    """lm-eval seeds Python, NumPy and torch: after run() they are where training left them, and the model trains."""
    model = tiny_decoder().train()
    evaluators = Evaluators(tasks=["curry_nextline"], limit=2)
    live = LiveModel(model, ParallelState(), None, 128)
    evaluators.prepare(live, byte_codec())
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    before = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    metrics = evaluators.run(live)
    after = (random.random(), np.random.rand(), torch.rand(1).item())
    assert before == after and model.training
    assert set(metrics) == {"eval/curry_nextline/acc", "eval/curry_nextline/acc_norm"}


# ------------------------------------------------------------------------------------------ in the loop


def test_in_the_loop_results_reach_the_journal_the_loggers_and_report_md(tmp_path, run_launch):
    """eval=synthetic + a held-out text set every 2 steps: the journal's evaluation events, TensorBoard's scalars and
    report.md hold the same numbers, and the training steps are exactly those of the same run without evaluation."""
    (tmp_path / "held.txt").write_text("import os\nprint(os.getcwd())\n" * 20)
    run = tmp_path / "run"
    result = run_launch(f"hydra.run.dir={run}", *EVAL_RUN, "logger=[jsonl,tensorboard]", f"+eval.texts.held={tmp_path / 'held.txt'}")
    assert result.returncode == 0, result.stderr[-2000:]
    found = events(run)
    assert [event["step"] for event in found] == [2, 4]
    names = {key for key in found[-1] if key.startswith("eval/")}
    assert {
        "eval/curry_nextline/acc",
        "eval/curry_complete/exact_match",
        "eval/curry_perplexity/bits_per_byte",
        "eval/held/loss",
        "eval/held/bits_per_byte",
    } <= names
    assert found[-1]["higher_is_better"]["eval/curry_nextline/acc"] is True and found[-1]["higher_is_better"]["eval/held/loss"] is False

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run / "tb"))
    accumulator.Reload()
    scalars = accumulator.Scalars("eval/curry_nextline/acc_norm")
    assert [(s.step, round(s.value, 6)) for s in scalars] == [(e["step"], round(e["eval/curry_nextline/acc_norm"], 6)) for e in found]
    report = (run / "report.md").read_text()
    assert "## Evaluation" in report and f"{found[-1]['eval/held/loss']:.4g}" in report

    plain = tmp_path / "plain"
    assert run_launch(f"hydra.run.dir={plain}", *EVAL_RUN[:2], "trainer.max_steps=4", "trainer.eval_every=2").returncode == 0
    assert train_losses(run) == train_losses(plain)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["fsdp", "tp"])
def test_two_processes_evaluate_as_one_process_does(layout, tmp_path, run_launch):
    """parallel=fsdp (or tp) with parallel.nproc=2 gives the numbers of one process at the same steps: under fsdp the
    documents and windows are split over the ranks, forwards run in step and generation recomputes on the sharded
    model; under tp both ranks share the work, sequences padded to the degree, logits gathered from their shards."""
    (tmp_path / "held.txt").write_text("for i in range(3):\n    print(i * i)\n" * 40)
    common = [*EVAL_RUN, "eval.tasks=[curry_nextline,curry_complete,curry_perplexity]", f"+eval.texts.held={tmp_path / 'held.txt'}", "eval.limit=3"]
    common += ["model.n_kv_heads=2"] if layout == "tp" else []  # tensor parallelism splits the kv heads too
    single, sharded = tmp_path / "single", tmp_path / layout
    assert run_launch(f"hydra.run.dir={single}", *common).returncode == 0
    result = run_launch(f"hydra.run.dir={sharded}", *common, f"parallel={layout}", "parallel.nproc=2")
    assert result.returncode == 0, result.stderr[-3000:]
    ones, twos = events(single), events(sharded)
    assert [e["step"] for e in ones] == [e["step"] for e in twos] == [2, 4]
    for one, two in zip(ones, twos):
        for key, value in one.items():
            if key.startswith("eval/"):
                assert math.isclose(two[key], value, rel_tol=1e-4, abs_tol=1e-6), (one["step"], key, value, two[key])


# ------------------------------------------------------------------------------------------ after training


def test_currytrain_eval_matches_the_loops_last_evaluation_and_journals_it(tmp_path, run_launch, capsys):
    """`currytrain eval RUN` on the run's latest checkpoint gives the numbers the loop gave at that step, appends an
    evaluation event naming the checkpoint, and rewrites report.md's section; an import folder's go to --out."""
    run = tmp_path / "run"
    assert run_launch(f"hydra.run.dir={run}", *EVAL_RUN, "eval.tasks=[curry_nextline,curry_perplexity]").returncode == 0
    loop = events(run)[-1]
    assert main(["eval", str(run), "tasks=[curry_nextline,curry_perplexity]", "limit=4", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    after = events(run)[-1]
    assert after["source"] == "currytrain eval" and after["weights"].endswith("checkpoints/step_4") and after["step"] == 4
    for key, value in loop.items():
        if key.startswith("eval/"):
            assert math.isclose(printed[key], value, rel_tol=1e-9) and math.isclose(after[key], value, rel_tol=1e-9), key
    assert "eval/curry_nextline/acc_stderr" in printed  # after training lm-eval's standard errors come too
    assert (run / "report.md").read_text().count("## Evaluation") == 1


@pytest.mark.slow  # four runs
def test_compare_decides_on_a_task_metric_in_its_direction(tmp_path, run_launch, capsys):
    """compare --metric eval/<task>/<metric> reads the runs' final task metric and takes lm-eval's direction for it."""
    for lr in ("0.01", "0.0001"):
        for seed in (0, 1):
            assert (
                run_launch(
                    f"hydra.run.dir={tmp_path / f'lr{lr}_s{seed}'}", *EVAL_RUN, "eval.tasks=[curry_nextline]", f"optimizer.lr={lr}", f"seed={seed}"
                ).returncode
                == 0
            )
    capsys.readouterr()
    assert main(["compare", str(tmp_path), "--metric", "eval/curry_nextline/acc_norm", "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "2 run(s), final eval/curry_nextline/acc_norm" in out
    report = (tmp_path / "cmp" / "report.md").read_text()
    assert "Final `eval/curry_nextline/acc_norm` (maximize)" in report
    assert main(["compare", str(tmp_path), "--metric", "eval/curry_nextline/acc_norm", "--direction", "minimize", "--out", str(tmp_path / "cmp2")]) == 0
    assert "(minimize)" in (tmp_path / "cmp2" / "report.md").read_text()


# ------------------------------------------------------------------------------------------ the shipped set


def test_the_shipped_tasks_are_what_the_generator_writes(tmp_path):
    """currytrain/eval/tasks/ is the output of `python -m currytrain.eval.synthetic` (byte for byte on the Python
    version it was made with), and every task of it is local and found."""
    source = json.loads((SHIPPED_DIR / "source.json").read_text())
    assert task_problems(["curry"], []) == []  # the tag names all three
    if source["python"] != sys.version.split()[0]:
        pytest.skip(f"the shipped set was made from Python {source['python']}'s standard library; this is {sys.version.split()[0]}")
    written = write_task_set(tmp_path)
    for path in written:
        assert path.read_bytes() == (SHIPPED_DIR / path.name).read_bytes(), path.name


# ------------------------------------------------------------------------------------------ bad input


def local_task(folder: Path, name: str = "mine", **fields) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test.jsonl").write_text(json.dumps({"context": "x = ", "choices": ["1", "2"], "label": 0}) + "\n")
    config = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": "test.jsonl"}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "context",
        "doc_to_choice": "choices",
        "doc_to_target": "label",
        **fields,
    }
    import yaml

    (folder / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return folder / f"{name}.yaml"


def test_bad_tasks_and_text_sets_are_config_errors_naming_the_file_and_the_fix(tmp_path, compose_cfg, run_launch):
    """A missing task, a malformed task file, a task that would download, a missing data file or task folder, a missing
    text set, no evaluator, evaluators under pipeline parallelism or on data that is not text: validation names each;
    launch.py exits 2 before the run folder exists."""
    from currytrain.validate import validate

    local_task(tmp_path / "ok")
    local_task(tmp_path / "hub", "hubby", dataset_path="some_org/some_dataset", dataset_kwargs={})
    local_task(tmp_path / "nodata", "lost", dataset_kwargs={"data_files": {"test": "missing.jsonl"}})
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "bad.yaml").write_text("task: [unclosed\n")
    cases = {
        "missing task": (["eval=local", "eval.tasks=[nope]"], "eval.tasks: nope is no task"),
        "malformed": (
            ["eval=local", "eval.tasks=[mine]", f"eval.task_paths=[{tmp_path / 'ok'},{tmp_path / 'broken'}]"],
            "bad.yaml is not a readable YAML file",
        ),
        "download": (
            ["eval=local", "eval.tasks=[hubby]", f"eval.task_paths=[{tmp_path / 'hub'}]"],
            "reads dataset_path=some_org/some_dataset from the Hugging Face Hub",
        ),
        "data file": (["eval=local", "eval.tasks=[lost]", f"eval.task_paths=[{tmp_path / 'nodata'}]"], "missing.jsonl, which does not exist: write that file"),
        "task folder": (["eval=local", "eval.tasks=[mine]", f"eval.task_paths=[{tmp_path / 'nowhere'}]"], "is not a folder"),
        "text set": (["eval=local", f"+eval.texts.wiki={tmp_path / 'wiki.txt'}"], "eval.texts.wiki="),
        "no evaluator": (["eval=local"], "no evaluator"),
        "pipeline": (["eval=synthetic", "parallel=pp", "parallel.nproc=2", "model.n_layers=2"], "parallel.pp=2"),
        "not text": (["eval=synthetic", "data=probe", "model.vocab_size=32"], "which is not text"),
        "context": (["eval=synthetic", "eval.seq_len=64"], "eval.seq_len=64 exceeds model.max_seq_len=32"),
    }
    for what, (overrides, message) in cases.items():
        problems = validate(compose_cfg(*overrides))
        assert any(message in problem for problem in problems), (what, problems)
    for what in ("download", "text set"):
        run = tmp_path / f"run-{what.replace(' ', '_')}"
        result = run_launch(f"hydra.run.dir={run}", *cases[what][0])
        assert result.returncode == 2 and cases[what][1] in result.stderr, (what, result.stderr[-1500:])
        assert not run.exists(), what


def test_a_prompt_longer_than_the_context_exits_2_before_the_first_step(tmp_path, run_launch):
    """eval.seq_len shorter than a task's prompts: the run stops before training, naming the task's file and the fix."""
    run = tmp_path / "run"
    result = run_launch(f"hydra.run.dir={run}", *EVAL_RUN, "eval.tasks=[curry_nextline]", "eval.seq_len=16")
    assert result.returncode == 2
    assert "curry_nextline" in result.stderr and "nextline.yaml" in result.stderr and "pass a larger eval.seq_len" in result.stderr
    assert not (run / "checkpoints").exists() and not events(run, "metrics")


@pytest.mark.slow
def test_sharded_generation_runs_in_step_and_equals_the_cached_one(tmp_path, compose_cfg):
    """Two ranks with different numbers of prompts generate through the in-step path (the whole sequence each token,
    a done rank repeating its last forward): every rank's text equals one process's cached generation of its prompts,
    stop strings and max_gen_toks included."""
    from omegaconf import OmegaConf
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from currytrain.eval.lm import CurryTrainLM
    from currytrain.eval.text import byte_codec
    from currytrain.model import build_model
    from tests.eval_worker import PROMPTS, generate_each

    cfg = compose_cfg("parallel=ddp", "parallel.nproc=2", "model.max_seq_len=64")
    OmegaConf.save(cfg, tmp_path / "resolved.yaml", resolve=True)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, run_id="test-eval")
    elastic_launch(config, generate_each)(str(tmp_path / "resolved.yaml"), str(tmp_path))
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    lm = CurryTrainLM(LiveModel(model, ParallelState(), None, 64), byte_codec(), batch_size=2, max_new_tokens=8, seed=0, task_files={})
    for rank, prompts in enumerate(PROMPTS):
        expected = lm.generate_until([type("Request", (), {"args": prompt, "task_name": "t"})() for prompt in prompts])
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == expected
        free = lm.generate_until([type("Request", (), {"args": (context, {**options, "until": []}), "task_name": "t"})() for context, options in prompts])
        assert any(len(text) < len(whole) and whole.startswith(text) for text, whole in zip(expected, free)), (
            f"rank {rank}: no stop string ended a generation early ({expected}): pick stop strings this model writes"
        )


# ------------------------------------------------------------------------------------------ parity with lm-eval's HF backend


def harness_samples(lm, configs: list[dict], limit: int) -> dict:
    """lm-eval's results and per-document samples of `configs` for an LM (simple_evaluate, offline, every sample kept)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from currytrain.eval.runner import offline

    with offline():
        return lm_eval.simple_evaluate(
            model=lm,
            tasks=[{k: v for k, v in c.items() if k != "__yaml__"} for c in configs],
            limit=limit,
            log_samples=True,
            bootstrap_iters=0,
            task_manager=TaskManager(include_defaults=False),
        )


@pytest.mark.slow
def test_the_adapter_scores_as_lm_evals_hf_backend_on_the_exported_checkpoint(tmp_path, run_launch):
    """A run on a BPE tokenizer, exported with `currytrain hf export`: lm-eval's HFLM on the export and curryTrain's
    adapter on the checkpoint give each document's loglikelihoods within 1e-4 (multiple choice and rolling), the same
    greedy flags, accuracies and generated text."""
    pytest.importorskip("accelerate")
    from lm_eval.models.huggingface import HFLM
    from tiny_tokenizer import train_tokenizer, write_corpus

    from currytrain.eval.lm import CurryTrainLM
    from currytrain.eval.source import load_source
    from currytrain.eval.tasks_local import task_configs
    from currytrain.hf import export_hf

    tokenizer = train_tokenizer(tmp_path / "tokenizer", vocab_size=320)
    corpus = write_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    overrides = ["data=tokens", f"data.tokenizer={tokenizer}", f"data.paths=[{corpus}]", f"data.cache_dir={tmp_path / 'cache'}", "model.vocab_size=320"]
    assert run_launch(f"hydra.run.dir={run}", "logger=[jsonl]", "model.max_seq_len=128", "trainer.max_steps=4", *overrides).returncode == 0
    export_hf(run, tmp_path / "exported")
    configs = task_configs(["curry_nextline", "curry_perplexity", "curry_complete"], [])
    limit = 6
    reference = harness_samples(HFLM(pretrained=str(tmp_path / "exported"), batch_size=4, device="cpu", max_length=128, dtype="float32"), configs, limit)
    source = load_source(run)
    ours_lm = CurryTrainLM(LiveModel(source.model, ParallelState(), None, 128), source.codec, batch_size=4, max_new_tokens=32, seed=0, task_files={})
    ours = harness_samples(ours_lm, configs, limit)
    for task in ("curry_nextline", "curry_perplexity", "curry_complete"):
        theirs_docs, ours_docs = reference["samples"][task], ours["samples"][task]
        assert len(theirs_docs) == len(ours_docs) == limit
        for theirs, mine in zip(theirs_docs, ours_docs):
            for a, b in zip(theirs["resps"], mine["resps"]):
                if task == "curry_complete":
                    assert a == b
                elif task == "curry_nextline":
                    assert math.isclose(a[0][0], b[0][0], abs_tol=1e-4) and a[0][1] == b[0][1], (a, b)
                else:
                    assert math.isclose(a[0], b[0], abs_tol=1e-4), (a, b)
    assert reference["results"]["curry_nextline"]["acc,none"] == ours["results"]["curry_nextline"]["acc,none"]
    assert reference["results"]["curry_nextline"]["acc_norm,none"] == ours["results"]["curry_nextline"]["acc_norm,none"]
