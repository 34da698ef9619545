"""The model protocol (currytrain/model/protocol.py): a plain nn.Module trains and climbs the ladder as it is; its
optional loss, parameter groups and repeated blocks are used by the trainer, the stages and the bench alike,
found by type and never by an attribute name. docs/model.md's bring-your-own-model example climbs check=sanity
as written, through `currytrain init` and `currytrain scaffold`, and so does the scaffolded model itself."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import ROOT
from currytrain.benchmark import model_sizes
from currytrain.build import build
from currytrain.components import build_components
from currytrain.model.protocol import HasLoss, find_blocks, hook, optimizer_groups, task_loss
from currytrain.parallel.state import ParallelState
from currytrain.trainer.trainer import Trainer
from tests import plain_models

SMALL_DATA = "data.max_bytes=300000"


class Leaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(5000, 8), nn.Embedding(64, 8)  # two large embeddings: no stack
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(3)))
        self.loss = nn.CrossEntropyLoss()  # a module stored under the hook's name is not the hook


def test_blocks_are_found_by_structure_whatever_their_attribute():
    assert [name for name, _ in find_blocks(plain_models.PlainLM(n_layers=3))] == ["h.0", "h.1", "h.2"]
    assert [name for name, _ in find_blocks(Leaf())] == ["blocks.0", "blocks.1", "blocks.2"], "composite blocks beat two big embeddings"
    one = nn.Module()
    one.stack = nn.ModuleList([plain_models.Block(8, 2)])
    assert [name for name, _ in find_blocks(one)] == ["stack.0"], "a one-block stack is still the stack"
    assert find_blocks(nn.Linear(3, 3)) == []

    class Declared(plain_models.PlainLM):
        def repeated_blocks(self):
            return [self.h[1]]

    assert [name for name, _ in find_blocks(Declared())] == ["h.1"]


def test_the_models_loss_is_found_by_type_and_called_with_targets_or_the_batch():
    logits, inputs, targets = torch.randn(2, 3, 7), torch.zeros(2, 3, dtype=torch.long), torch.randint(7, (2, 3))
    assert hook(Leaf(), HasLoss) is None, "self.loss = nn.CrossEntropyLoss() is a module, not the hook"
    default = task_loss(Leaf())(logits, (inputs, targets)).mean
    assert torch.allclose(default, F.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1)))

    class WithBatch(nn.Module):
        def loss(self, logits, batch):
            inputs, targets = batch
            return F.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1), reduction="none")[inputs.reshape(-1) == 0].mean()

    class WithTargets(nn.Module):
        def loss(self, logits, targets):
            return F.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1), ignore_index=0)

    assert torch.allclose(task_loss(WithBatch())(logits, (inputs, targets)).mean, default)
    expected = F.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1), ignore_index=0)
    assert torch.allclose(task_loss(WithTargets())(logits, (inputs, targets)).mean, expected)


def test_the_models_groups_become_the_optimizers():
    class Groups(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def param_groups(self):
            return [{"params": self.a.parameters(), "lr_scale": 0.5}, {"params": [self.b.weight], "weight_decay": 0.0}]

    groups = optimizer_groups(Groups(), weight_decay=0.1, lr=1e-3)
    assert groups[0]["lr"] == 5e-4 and "lr_scale" not in groups[0] and len(groups[0]["params"]) == 2
    assert groups[1]["weight_decay"] == 0.0 and "lr" not in groups[1], "torch fills the configured lr"

    class Loose(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def param_groups(self):
            return [self.a.weight, self.a.bias]  # plain parameters: the usual split, matrices decayed

    loose = Loose()
    matrices, vectors = optimizer_groups(loose, weight_decay=0.1, lr=1e-3)
    assert matrices["params"][0] is loose.a.weight and matrices["weight_decay"] == 0.1
    assert vectors["params"][0] is loose.a.bias and vectors["weight_decay"] == 0.0
    assert optimizer_groups(nn.Linear(2, 2), 0.1, 1e-3) is None


def test_the_trainer_and_bench_use_the_models_loss_groups_and_sizes(compose_cfg, tmp_path, one_thread):
    cfg = compose_cfg(SMALL_DATA, "logger=[jsonl]", "trainer.max_steps=2", "trainer.eval_every=2")
    data = plain_models.padded(build(cfg.data), declare_pad=False)  # pad id 0, which PlainLM's own loss ignores
    model = plain_models.PlainLM()
    parts = build_components(cfg, ParallelState(), data=data, model=model)
    assert [g["weight_decay"] for g in parts.optimizer.param_groups] == [0.1, 0.0], "PlainLM's own groups"
    inputs, targets = data.batch("val", 0, 0, 4)
    with torch.no_grad():
        total, count = model.loss(model(inputs), targets)  # (sum, count)
        own = float(total / count)
        default = float(F.cross_entropy(model(inputs).reshape(-1, 256), targets.reshape(-1)))
    with torch.no_grad():
        assert float(parts.forward_loss(inputs, targets)[0].mean) == pytest.approx(own) and own != pytest.approx(default)
    val = Trainer(cfg, tmp_path, ParallelState(), components=parts).train()
    assert math.isfinite(val)
    assert model_sizes(model, cfg.model) == (2, 32), "blocks and width from the model, not from model.n_layers/model.dim"


# ----------------------------------------------------------------------------------- the docs' example, as written


def _docs_model() -> str:
    text = (ROOT / "docs" / "model.md").read_text()
    section = text.split("## Bring your own model", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_docs_bring_your_own_model_and_the_scaffold_climb_check_sanity(tmp_path):
    cli = str(Path(sys.executable).parent / "currytrain")
    assert _run([cli, "init", "gpt_project"], tmp_path).returncode == 0
    project = tmp_path / "gpt_project"
    assert _run([cli, "scaffold", "tiny_gpt", "--kind", "lm"], project).returncode == 0
    assert _run([cli, "scaffold", "as_scaffolded", "--kind", "lm"], project).returncode == 0
    (project / "experiments" / "tiny_gpt" / "model.py").write_text(_docs_model())
    for name in ("tiny_gpt", "as_scaffolded"):
        run_dir = tmp_path / name
        result = _run([sys.executable, "launch.py", f"experiment={name}", "check=sanity", f"hydra.run.dir={run_dir}"], project)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        report = (run_dir / "report.md").read_text()
        assert "## sanity: passed" in report and "FAIL" not in report and "WARN" not in report, report
    assert "| h.1 |" in (tmp_path / "tiny_gpt" / "report.md").read_text(), "its blocks, found in self.h"
