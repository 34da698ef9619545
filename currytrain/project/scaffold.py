"""`currytrain scaffold NAME`: a new idea inside a project, runnable at once with experiment=NAME.

It writes experiments/NAME/ (config.py with typed configs and their SCHEMAS, model.py, dataset.py),
conf/model/NAME.yaml, conf/data/NAME.yaml, conf/experiment/NAME.yaml and tests/test_NAME.py, and never
replaces a file. Kinds: lm (a causal transformer on a token stream), classifier (one label per sequence:
logits (batch, 1, classes) against labels (batch, 1), so the trainer's cross-entropy is unchanged) and
custom (the bare contract between model, data and trainer). `--from FAMILY` starts an lm from a copy of a
built-in model family instead.
"""

from __future__ import annotations

import keyword
from importlib import resources
from pathlib import Path

from currytrain.config import SCHEMAS
from currytrain.errors import ConfigError
from currytrain.project.files import render, write_files

KINDS = ("lm", "classifier", "custom")
FAMILIES = tuple(SCHEMAS["model"])
"""Built-in model families --from can copy (currytrain/model/<family>.py)."""
NAMED_GROUPS = ("model", "data", "experiment")
"""Config groups that get an option called NAME."""
SMALL_FAMILY_TEST = {
    "small_sizes": """
SMALL = ["model.dim=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1", "model.mlp_hidden=64", "model.max_seq_len=32"]
\"\"\"Smaller than model/size=debug, so the test run takes seconds: it checks that the model trains, not how well.\"\"\"
""",
    "small_args": ", *SMALL",
}
"""What the generated test of a --from experiment adds, so that its run stays quick."""


def scaffold(name: str, *, kind: str = "lm", family: str | None = None, start: Path) -> list[Path]:
    """Write experiment `name` into the project around folder `start`; returns the files written."""
    root = find_project(Path(start).resolve())
    if family is not None and kind != "lm":
        raise ConfigError(f"--from {family} copies a language-model family, so it needs --kind lm (not --kind {kind}): drop --kind or --from")
    problem = name_problem(name, root)
    if problem:
        raise ConfigError(f"scaffold {name!r}: {problem}; nothing was written")
    return write_files(root, scaffold_files(name, kind, family))


def find_project(start: Path) -> Path:
    """The project folder (the one with launch.py and conf/project.yaml) at or above start."""
    for folder in (start, *start.parents):
        if (folder / "conf" / "project.yaml").is_file() and (folder / "launch.py").is_file():
            return folder
    raise ConfigError(f"{start} is not inside a curryTrain project (no conf/project.yaml here or above): run `currytrain init DIR`, then scaffold inside DIR")


def name_problem(name: str, root: Path) -> str | None:
    """Why `name` cannot name a new experiment of the project at root, or None."""
    if not name.isidentifier() or keyword.iskeyword(name):
        return "NAME must be a Python identifier (letters, digits and _, not starting with a digit, not a keyword), e.g. my_idea"
    taken = [f"{path.relative_to(root)}" for path in own_paths(name, root) if path.exists()]
    taken += [f"curryTrain's {group}={name}" for group in NAMED_GROUPS if name in builtin_options(group)]
    if taken:
        return f"the name is taken by {', '.join(taken)}: choose another NAME"
    return None


def own_paths(name: str, root: Path) -> list[Path]:
    return [root / "experiments" / name, root / "tests" / f"test_{name}.py", *(root / "conf" / group / f"{name}.yaml" for group in NAMED_GROUPS)]


def builtin_options(group: str) -> set[str]:
    """curryTrain's own options of a group: a project file of the same name would hide one."""
    folder = resources.files("currytrain.conf").joinpath(group)
    return {entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml")} if folder.is_dir() else set()


def scaffold_files(name: str, kind: str, family: str | None) -> dict[str, str]:
    """Experiment path -> text: the kind's templates, or for --from the family's copy and the lm data."""
    values = template_values(name, kind, family)
    source, data_kind, package = ("from" if family else kind), ("lm" if family else kind), f"experiments/{name}"
    return {
        f"{package}/__init__.py": render("scaffold/common/init.py.tmpl", **values),
        f"{package}/config.py": render(f"scaffold/{source}/config.py.tmpl", **values),
        f"{package}/model.py": copied_family(family, values) if family else render(f"scaffold/{kind}/model.py.tmpl", **values),
        f"{package}/dataset.py": render(f"scaffold/{data_kind}/dataset.py.tmpl", **values),
        f"conf/model/{name}.yaml": render("scaffold/common/model.yaml.tmpl", **values),
        f"conf/data/{name}.yaml": render("scaffold/common/data.yaml.tmpl", **values),
        f"conf/experiment/{name}.yaml": render("scaffold/common/experiment.yaml.tmpl", **values),
        f"tests/test_{name}.py": render("scaffold/common/test.py.tmpl", **values),
    }


def template_values(name: str, kind: str, family: str | None) -> dict[str, str]:
    """What fills the templates' {{placeholders}}."""
    values = {"name": name, "Name": "".join(part[:1].upper() + part[1:] for part in name.split("_")) or name, "kind": kind}
    if family is None:
        values |= {"small_sizes": "", "small_args": "", "values": "", "size": "null  # curryTrain's sizes set decoder fields this model does not have"}
    else:
        schema = SCHEMAS["model"][family]
        values |= {"kind": f"lm from {family}", "family": family, "family_config": schema.__name__, "family_class": schema._target_.rpartition(".")[2]}
        values |= {**SMALL_FAMILY_TEST, "values": family_values(family), "size": "debug  # model/size=tiny|small: curryTrain's sizes of its decoder families"}
    if kind == "lm":
        values["data_config"] = render("scaffold/lm/data_config.py.tmpl", **values).rstrip("\n")
    return values


def family_values(family: str) -> str:
    """The values curryTrain's conf/model/<family>.yaml chooses (what follows its defaults list), to edit in the copy's."""
    text = resources.files("currytrain.conf").joinpath("model", f"{family}.yaml").read_text()
    return "\n" + text.split("- _self_\n", 1)[1].lstrip("\n")


def copied_family(family: str, values: dict[str, str]) -> str:
    """The source of currytrain/model/<family>.py with its module docstring replaced by one about the copy."""
    source = resources.files("currytrain.model").joinpath(f"{family}.py").read_text()
    body = source[source.index('"""', 3) + 3 :]  # everything after the module docstring
    return render("scaffold/from/model_header.py.tmpl", **values).rstrip("\n") + body
