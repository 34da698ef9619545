"""A new user's first hour, as they meet it: `currytrain init` in a fresh folder, an idea of every kind scaffolded, each
learning with its own settings (its generated test says so), then every `currytrain` tool run from inside the project on
its experiments and its runs, without extra flags: estimate, advise, bench, journal --plot, diagnose, compare, hf export.
And the mistakes a new user makes there, each answered with the key and the fix."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from currytrain.cli import main as currytrain_main
from currytrain.journal import read_journal
from inprocess import project_imports, run_launch_py

KINDS = {"my_lm": ["--kind", "lm"], "my_classifier": ["--kind", "classifier"], "my_custom": ["--kind", "custom"], "my_gqa": ["--from", "gqa"]}
QUICK = ["trainer.max_steps=12", "trainer.eval_every=6", "trainer.batch_size=4", "trainer.eval_batches=2", "trainer.progress=false", "logger=[jsonl]"]
SMALL = ["model.dim=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1", "model.mlp_hidden=64", "model.max_seq_len=32"]
"""The sizes the generated test of a --from idea trains at."""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """`currytrain init my_project`, then `currytrain scaffold` of each kind inside it, as typed."""
    root = tmp_path_factory.mktemp("newcomer") / "my_project"
    assert currytrain_main(["init", str(root)]) == 0
    cwd = os.getcwd()
    os.chdir(root)
    try:
        with project_imports(root):  # the command puts the project first on sys.path; the test process's comes back
            for name, flags in KINDS.items():
                assert currytrain_main(["scaffold", name, *flags]) == 0
    finally:
        os.chdir(cwd)
    return root


@pytest.fixture
def inside(project, monkeypatch):
    """The shell of a user standing in the project: its folder, and (as `currytrain` there sees it) its experiments."""
    monkeypatch.chdir(project)
    with project_imports(project):
        yield project


def launch(project: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`python launch.py OVERRIDES` in the project (its own launch.py, run in this process)."""
    return run_launch_py(list(overrides), project / "launch.py")


@pytest.fixture(scope="module")
def runs(project) -> dict[str, Path]:
    """Short runs in the project: two seeds of the lm idea, and the idea copied from the gqa family."""
    made = {}
    for name, overrides in {"lm_0": ["experiment=my_lm", "seed=0"], "lm_1": ["experiment=my_lm", "seed=1"], "gqa": ["experiment=my_gqa", *SMALL]}.items():
        result = launch(project, *overrides, *QUICK, f"hydra.run.dir=runs/{name}")
        assert result.returncode == 0, result.stderr[-3000:]
        made[name] = project / "runs" / name
    return made


@pytest.mark.slow
def test_each_kind_of_idea_learns_with_its_own_settings(project):
    """The generated test of each idea trains it with its experiment's settings (fewer steps) and finds its val loss
    well below chance; run as the user runs it: pytest, in the project (the lm's runs in the getting-started walk)."""
    tests = [f"tests/test_{name}.py" for name in KINDS if name != "my_lm"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *tests], cwd=project, env=env, capture_output=True, text=True, timeout=1200
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    learned = [line for line in result.stdout.splitlines() if line.startswith("PASSED") and "_learns" in line]
    assert len(learned) == 3 and result.stdout.count("PASSED") == 9, result.stdout[-2000:]


def test_the_scaffolded_defaults_are_the_ones_that_learn(project):
    """What the generated tests rely on: the experiment's lr is the one measured to learn (1e-2), and the lm's data
    has small strides (guessable from the last token)."""
    experiment = (project / "conf" / "experiment" / "my_lm.yaml").read_text()
    assert "lr: 1.0e-2" in experiment and "max_steps: 200" in experiment
    assert "max_stride: int = 4" in (project / "experiments" / "my_lm" / "config.py").read_text()
    assert "def test_my_lm_learns" in (project / "tests" / "test_my_lm.py").read_text()


@pytest.mark.slow
def test_every_tool_sees_the_project_and_its_runs(inside, runs, capsys, tmp_path):
    def tool(*args: str) -> str:
        code = currytrain_main(list(args))
        out = capsys.readouterr()
        assert code == 0, f"currytrain {' '.join(args)} exited {code}: {out.err[-3000:]}"
        return out.out

    assert "tokens x" in tool("estimate", "experiment=my_lm")  # the project's experiment, by name
    assert "bound by kernel launches" in tool("estimate", str(runs["lm_0"]), "--gpu", "h100")  # a run folder
    table = tool("advise", "experiment=my_classifier", "--gpus", "2", "--gpu-mem", "1GiB")
    assert "dp2 ddp" in table and "dp2 zero1" in table and "zero18" not in table
    assert json.loads(tool("advise", str(runs["lm_0"]), "--json"))["num_params"] > 0
    assert "tokens/s" in tool("bench", "experiment=my_custom", "--steps", "2", "--warmup", "1")
    assert "finish" in tool("journal", str(runs["lm_0"]), "--plot") and (runs["lm_0"] / "curves.png").is_file()
    tool("diagnose", str(runs["lm_0"]))
    assert "report:" in tool("compare", str(runs["lm_0"]), str(runs["lm_1"]), "--out", str(tmp_path / "compare"))

    # The idea copied from the gqa family computes what the family computes: it exports as Llama, and transformers
    # gives the logits of the run's own model.
    transformers = pytest.importorskip("transformers")
    tool("hf", "export", str(runs["gqa"]), str(tmp_path / "hf"))
    from currytrain.hf.convert import load_model

    ours = load_model(runs["gqa"])
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = __import__("torch").randint(256, (2, 16))
    assert __import__("torch").allclose(ours(tokens), theirs(tokens).logits, atol=1e-4)


def test_an_edited_copy_of_a_family_is_not_exported_as_that_family(inside, runs):
    """A copy whose forward differs from the family's is not Llama any more: export refuses it, naming the class."""
    from currytrain.hf.convert import computed_as_builtin, read_model

    model_py = inside / "experiments" / "my_gqa" / "model.py"
    if "class Doubled" not in model_py.read_text():
        model_py.write_text(
            model_py.read_text() + "\n\nclass Doubled(GQATransformer):\n    def forward(self, tokens):\n        return 2 * super().forward(tokens)\n"
        )
    node, state, _ = read_model(runs["gqa"])
    assert computed_as_builtin(node, state)["_target_"] == "currytrain.model.gqa.GQATransformer"
    assert computed_as_builtin({**node, "_target_": "experiments.my_gqa.model.Doubled"}, state) is None
    assert currytrain_main(["hf", "export", str(runs["gqa"]), str(inside / "out"), "--dtype", "float16"]) == 0  # the copy as run


def test_a_new_shell_exports_the_projects_runs(inside, runs, capsys, tmp_path, monkeypatch):
    """`currytrain hf export` in a new shell, where nothing composed a config first: it registers the project's classes
    itself, so the copy of the gqa family exports; an lm idea (its own class) is refused with exit 2, no traceback."""
    pytest.importorskip("transformers")
    from currytrain import build

    monkeypatch.setattr(build, "_registered", set(build.BUILT_IN_TARGETS))  # what a new process starts from
    assert currytrain_main(["hf", "export", str(runs["gqa"]), str(tmp_path / "gqa")]) == 0
    assert (tmp_path / "gqa" / "config.json").is_file()
    monkeypatch.setattr(build, "_registered", set(build.BUILT_IN_TARGETS))
    capsys.readouterr()
    assert currytrain_main(["hf", "export", str(runs["lm_0"]), str(tmp_path / "lm")]) == 2
    err = capsys.readouterr().err
    assert "MyLmModel has no Hugging Face counterpart" in err and "Traceback" not in err


def test_overrides_may_follow_an_option(inside, runs, capsys):
    """`currytrain estimate RUN --gpu h100 trainer.max_steps=10`: overrides after an option are still overrides
    (argparse alone would call them unrecognized arguments); anything else left over is still refused."""
    assert currytrain_main(["estimate", str(runs["lm_0"]), "--gpu", "h100", "trainer.max_steps=10"]) == 0
    assert capsys.readouterr().out.startswith("2,560 tokens x")  # 10 steps of 4 sequences of 64 tokens, not the run's 12
    with pytest.raises(SystemExit) as exited:
        currytrain_main(["journal", str(runs["lm_0"]), "trainer.max_steps=10"])
    assert exited.value.code == 2


def test_a_commands_config_error_says_currytrain_once(inside, capsys):
    """A typo given to a `currytrain` command is answered as launch.py answers it: one "curryTrain:", the key, the fix."""
    assert currytrain_main(["bench", "experiment=my_lm", "model.dimm=64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("curryTrain: the config has 1 problem:") and "did you mean model.dim? pass model.dim=64" in err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["model.foo=3"], "model.foo is not a field of MyLmModelConfig, the schema of your idea: add a field `foo`"),
        (["model.dimm=64"], "model.dimm is not a field of MyLmModelConfig: did you mean model.dim? pass model.dim=64"),
        (["data.max_strid=2"], "data.max_strid is not a field of MyLmDataConfig: did you mean data.max_stride? pass data.max_stride=2"),
        (["experiment=my_lmm"], "experiment=my_lmm: experiment has no option 'my_lmm': choose from ['baseline', 'digits', 'my_classifier'"),
    ],
    ids=["a field to add", "a typo", "a data typo", "an unknown experiment"],
)
def test_a_new_users_mistakes_are_answered_with_the_key_and_the_fix(inside, capsys, args, expected):
    overrides = args if args[0].startswith("experiment=") else ["experiment=my_lm", *args]
    assert currytrain_main(["estimate", *overrides]) == 2
    assert expected in capsys.readouterr().err


def test_a_key_in_an_ideas_yaml_that_its_schema_lacks_names_the_file_and_the_field_to_add(inside):
    model_yaml = inside / "conf" / "model" / "my_custom.yaml"
    original = model_yaml.read_text()
    model_yaml.write_text(original + "dropout: 0.1\n")
    try:
        result = launch(inside, "experiment=my_custom", *QUICK, "hydra.run.dir=runs/refused")
    finally:
        model_yaml.write_text(original)
    assert result.returncode == 2 and not (inside / "runs" / "refused").exists()
    assert "model.dropout (in conf/model/my_custom.yaml) is not a field of MyCustomModelConfig" in result.stderr
    assert "add a field `dropout` (its type, default and a docstring) to MyCustomModelConfig in experiments/my_custom/config.py" in result.stderr


def test_a_run_in_the_project_resumes_the_latest_of_its_experiment(inside, runs):
    result = launch(inside, "experiment=my_lm", "seed=1", *QUICK, "trainer.max_steps=15", "trainer.resume=latest", "hydra.run.dir=runs/lm_1_more")
    assert result.returncode == 0, result.stderr[-3000:]
    (resume,) = [event for event in read_journal(inside / "runs" / "lm_1_more" / "journal.jsonl") if event["type"] == "resume"]
    assert resume["step"] == 12 and Path(resume["path"]).parent.parent == runs["lm_1"]
    finish = [event for event in read_journal(inside / "runs" / "lm_1_more" / "journal.jsonl") if event["type"] == "finish"]
    assert finish[0]["step"] == 15 and math.isfinite(finish[0]["val_loss"])
