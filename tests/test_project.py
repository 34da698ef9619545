"""`currytrain init` and `currytrain scaffold` as a user runs them: a new project trains and passes its own
tests against the installed curryTrain, every kind of scaffolded idea trains at once, the generated code
passes the linter, and bad input exits 2 having written nothing."""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from currytrain.cli import main as currytrain_main
from currytrain.journal import read_journal
from currytrain.project.init import init_project
from currytrain.project.scaffold import FAMILIES, KINDS, scaffold

BIN = Path(sys.executable).parent
"""Where the environment's console scripts (currytrain, ruff) are."""
QUICK = ["trainer.max_steps=5", "trainer.batch_size=4", "trainer.eval_batches=2", "trainer.progress=false", "logger=[jsonl]"]


def run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def guide_commands() -> list[str]:
    text = (ROOT / "docs" / "getting-started.md").read_text()
    blocks = re.findall(r"```console\n(.*?)```", text, flags=re.S)
    return [line[2:].strip() for block in blocks for line in block.splitlines() if line.startswith("$ ")]


def as_args(command: str) -> list[str]:
    """A guide command as this environment runs it (its python, its console scripts), a run at tiny sizes (fewer
    steps, smaller batches: steps_of)."""
    args = shlex.split(command)
    if args[0] == "python" and args[1] == "launch.py":
        steps = next((int(a.split("=", 1)[1]) for a in args if a.startswith("trainer.max_steps=")), None)
        args = [a for a in args if not a.startswith("trainer.max_steps=")]
        return [sys.executable, *args[1:], *WALK, f"trainer.max_steps={steps_of(steps)}"]
    if args[0] == "python":
        return [sys.executable, *args[1:]]
    if args[0] == "pytest":
        return [sys.executable, "-m", "pytest", *args[1:]]
    return [str(BIN / args[0]), *args[1:]]


WALK = ["trainer.batch_size=4", "trainer.eval_every=5", "trainer.eval_batches=2", "trainer.log_every=1", "trainer.progress=false"]
"""What the walk adds to each run of the guide: small batches, frequent evals, every step logged (its curves.png has
their points); the steps: steps_of."""


def steps_of(written: int | None) -> int:
    """The steps a guide's run takes in the walk: a twentieth of what it says (its experiment's 200 when it says
    none), at least 5, so that `trainer.max_steps=300 trainer.resume=latest` still continues a 200-step run."""
    return max(5, (written or 200) // 20)


@pytest.mark.slow
def test_getting_started_commands_work_as_written(tmp_path):
    commands = guide_commands()
    assert commands[0].startswith("pip install") and any(c.startswith("currytrain scaffold") for c in commands)
    cwd = tmp_path
    for command in commands[1:]:  # pip install: this environment has curryTrain installed already
        if command.startswith("cd "):
            cwd = cwd / command[3:]
            continue
        result = run(as_args(command), cwd)
        assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    idea = cwd / "runs" / "my_idea"
    assert [e["step"] for e in read_journal(idea / "journal.jsonl") if e["type"] == "finish"] == [steps_of(None)]
    assert (idea / "curves.png").is_file(), "currytrain journal --plot drew no figure"
    continued = [e for path in cwd.glob("runs/2*/*/journal.jsonl") for e in read_journal(path) if e["type"] == "resume"]
    assert [(Path(e["path"]).parent.parent, e["step"]) for e in continued] == [(idea, steps_of(None))], "trainer.resume=latest"
    assert len(list(cwd.glob("runs/2*/*/report.md"))) == 1, "check=sanity wrote no report"
    results = yaml.safe_load((cwd / "runs" / "sweeps" / "tpe" / "optimization_results.yaml").read_text())
    assert math.isfinite(results["best_value"]) and len(list(cwd.glob("runs/sweeps/tpe/[0-9]/journal.jsonl"))) == 3


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """One project with an idea of every kind, and one from a built-in family."""
    root = tmp_path_factory.mktemp("project") / "ideas"
    init_project(root)
    for kind in KINDS:
        scaffold(f"my_{kind}", kind=kind, start=root)
    scaffold("my_gqa", family="gqa", start=root / "experiments")  # from a subfolder: scaffold finds the project
    return root


@pytest.mark.slow
@pytest.mark.parametrize("name", ["my_classifier", "my_custom", "my_gqa"])  # an lm trains in the guide's test
def test_each_kind_of_idea_trains_at_once(project, name, tmp_path):
    result = run([sys.executable, "launch.py", f"experiment={name}", f"hydra.run.dir={tmp_path}", *QUICK], project)
    assert result.returncode == 0, result.stderr[-3000:]
    finish = [event for event in read_journal(tmp_path / "journal.jsonl") if event["type"] == "finish"]
    assert finish[0]["step"] == 5 and math.isfinite(finish[0]["val_loss"])
    assert (tmp_path / "resolved.yaml").read_text().count(f"experiments.{name}.") == 2  # its model and its data


@pytest.mark.slow
def test_a_classifier_idea_climbs_check_sanity(project, tmp_path):
    """The stages ask the adapter for its shapes (targets (batch, 1), num_classes) instead of assuming a language model's."""
    result = run([sys.executable, "launch.py", "experiment=my_classifier", "check=sanity", f"hydra.run.dir={tmp_path}", *QUICK], project)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = (tmp_path / "report.md").read_text()
    assert "| batch shapes | PASS | inputs (2, 32) torch.int64" in report and "targets (2, 1) torch.int64" in report
    assert "| causality | SKIP | not a next-token task" in report and "## sanity: " in report


def test_generated_code_passes_the_linter(project):
    for family in FAMILIES:
        scaffold(f"from_{family}", family=family, start=project)
    for check in (["check", "."], ["format", "--check", "."]):
        result = run([str(BIN / "ruff"), *check], project)
        assert result.returncode == 0, result.stdout + result.stderr


def test_scaffold_writes_the_files_it_promises(project):
    package = project / "experiments" / "my_classifier"
    assert sorted(path.name for path in package.iterdir()) == ["__init__.py", "config.py", "dataset.py", "model.py"]
    for group in ("model", "data", "experiment"):
        assert (project / "conf" / group / "my_classifier.yaml").is_file()
    assert "def test_my_classifier_learns" in (project / "tests" / "test_my_classifier.py").read_text()
    copied = (project / "experiments" / "my_gqa" / "model.py").read_text()
    assert "class GQATransformer(RopeDecoder)" in copied and "copy of curryTrain's gqa family" in copied


def test_copy_framework_runs_its_own_copy(tmp_path):
    init_project(tmp_path, copy_framework=True)
    assert (tmp_path / "currytrain" / "conf" / "model" / "gqa.yaml").is_file()
    pyproject = (tmp_path / "pyproject.toml").read_text()
    assert '"currytrain>=' not in pyproject and '"torch' in pyproject
    where = run([sys.executable, "-c", "import currytrain; print(currytrain.__file__)"], tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(tmp_path)
    composed = run([sys.executable, "launch.py", "--cfg", "job", "model.dim=64"], tmp_path)
    assert composed.returncode == 0, composed.stderr
    assert "dim: 64" in composed.stdout and "mlp_hidden: 384" in composed.stdout  # the baseline: debug size


def test_wheel_ships_the_config_tree_and_templates_but_no_experiments(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(".venv", ".git", "runs", "build", "*.egg-info", "__pycache__"))
    result = run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist")], source)
    assert result.returncode == 0, result.stderr
    names = set(zipfile.ZipFile(next((tmp_path / "dist").glob("*.whl"))).namelist())
    config_files = {f"currytrain/conf/{path.relative_to(ROOT / 'conf').as_posix()}" for path in (ROOT / "conf").rglob("*.yaml")}
    assert config_files <= names and "currytrain/conf/__init__.py" in names
    assert "currytrain/project/templates/project/launch.py.tmpl" in names
    assert not any(name.startswith("experiments/") for name in names)


# ------------------------------------------------------------------------------------------ bad input


def test_init_refuses_a_folder_that_is_not_empty(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    assert currytrain_main(["init", str(tmp_path)]) == 2
    assert "is not empty" in capsys.readouterr().err and snapshot(tmp_path) == before


def test_init_force_writes_into_a_folder_and_keeps_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "README.md").write_text("old")
    assert currytrain_main(["init", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "README.md").read_text() != "old"


def test_the_console_script_exits_2_for_bad_input(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = run([str(BIN / "currytrain"), "init", str(tmp_path)], tmp_path)
    assert result.returncode == 2 and "pass a new or empty folder" in result.stderr


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("1st_idea", "must be a Python identifier"),
        ("my-idea", "must be a Python identifier"),
        ("class", "must be a Python identifier"),
        ("baseline", "conf/experiment/baseline.yaml"),
        ("taken", "experiments/taken"),
        ("gqa", "curryTrain's model=gqa"),
        ("bytes", "curryTrain's data=bytes"),
    ],
)
def test_scaffold_refuses_a_bad_or_taken_name(tmp_path, monkeypatch, capsys, name, message):
    init_project(tmp_path)
    (tmp_path / "experiments" / "taken").mkdir()
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert currytrain_main(["scaffold", name]) == 2
    assert message in capsys.readouterr().err and snapshot(tmp_path) == before


def test_scaffold_twice_refuses_the_second_and_keeps_the_first(tmp_path, monkeypatch):
    init_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert currytrain_main(["scaffold", "idea"]) == 0
    before = snapshot(tmp_path)
    assert currytrain_main(["scaffold", "idea", "--kind", "custom"]) == 2
    assert snapshot(tmp_path) == before


def test_scaffold_outside_a_project_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert currytrain_main(["scaffold", "idea"]) == 2
    assert "not inside a curryTrain project" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_scaffold_from_a_family_needs_kind_lm(tmp_path, monkeypatch, capsys):
    init_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert currytrain_main(["scaffold", "idea", "--kind", "classifier", "--from", "gqa"]) == 2
    assert "needs --kind lm" in capsys.readouterr().err and snapshot(tmp_path) == before
