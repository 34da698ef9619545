"""lm-evaluation-harness tasks from local files, found and checked without importing lm-eval (validation runs this
before anything starts): the task YAMLs of eval.task_paths and of the shipped set, and whether each reads local data.

A task reads local data when its dataset_path is one of datasets' file builders (json, csv, parquet, text, arrow)
whose dataset_kwargs.data_files all exist (paths relative to the task's YAML), or a local folder, or when it
builds its own dataset (custom_dataset). Anything else would be downloaded from the Hugging Face Hub: that is a
problem naming the task's file and what to write instead. Relative data files are made absolute here, so a task
folder works from any working directory.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SHIPPED_DIR = Path(__file__).resolve().parent / "tasks"
"""The task set shipped with curryTrain (written by currytrain.eval.synthetic)."""
FILE_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
"""datasets' builders that read local files named by data_files."""
TEXT_SUFFIXES = (".txt", ".md", ".py", ".jsonl", ".parquet", ".arrow")


@dataclass
class TaskFile:
    """One entry of the local index: a task, a group or a tag, and the YAML that defines it."""

    name: str
    kind: str
    """task, group or tag."""
    path: Path
    config: dict[str, Any]
    members: list[str]
    """A group's or tag's task names."""


class _Loader(yaml.SafeLoader):
    """YAML as lm-eval writes it, without running anything: `!function module.name` stays the string it names."""


_Loader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


def read_task_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A task YAML with its `include:` (relative to it) merged underneath; a problem raises ValueError naming the file."""
    if path in seen:
        raise ValueError(f"{path} includes itself (through {', '.join(map(str, seen))})")
    try:
        config = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"{path} is not a readable YAML file ({str(error).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds no YAML mapping (a task file has keys such as task, dataset_path, output_type)")
    merged: dict[str, Any] = {}
    for include in _as_list(config.pop("include", None)):  # the including file's keys win
        base = (path.parent / include).resolve()
        if not base.is_file():
            raise ValueError(f"{path} includes {include}, which is not a file next to it")
        merged.update(read_task_yaml(base, (*seen, path)))
    return {**merged, **config}


def _yaml_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*.yaml")):
        if not any(part in ("__pycache__", ".ipynb_checkpoints") for part in path.parts):
            yield path


def build_index(task_paths: list[str]) -> tuple[dict[str, TaskFile], list[str]]:
    """({name: TaskFile} of the shipped set and the folders of task_paths (a later folder's name wins), [problems
    with those folders and files])."""
    index: dict[str, TaskFile] = {}
    problems = []
    folders = [SHIPPED_DIR, *(Path(p).expanduser() for p in task_paths)]
    for number, folder in enumerate(folders):
        if not folder.is_dir():
            problems.append(f"eval.task_paths[{number - 1}]={folder} is not a folder: pass a folder of lm-eval task YAMLs")
            continue
        for path in _yaml_files(folder):
            try:
                config = read_task_yaml(path)
            except ValueError as error:
                problems.append(f"{error}: fix or remove it (eval.task_paths reads every .yaml below {folder})")
                continue
            for entry in _entries(path, config):
                index[entry.name] = entry
    for entry in list(index.values()):  # tags collect the tasks that name them
        if entry.kind == "task":
            for tag in _as_list(entry.config.get("tag")):
                index.setdefault(tag, TaskFile(tag, "tag", entry.path, {}, []))
                if index[tag].kind == "tag":
                    index[tag].members.append(entry.name)
    return index, problems


def _entries(path: Path, config: dict[str, Any]) -> list[TaskFile]:
    if "group" in config and isinstance(config.get("task"), list):
        members = [str(t) for t in config["task"] if isinstance(t, str)]
        return [TaskFile(str(config["group"]), "group", path, config, members)]
    if isinstance(config.get("task"), str):
        return [TaskFile(config["task"], "task", path, config, [])]
    return []  # a base file included by others


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def expand(names: list[str], index: dict[str, TaskFile]) -> tuple[list[TaskFile], list[str]]:
    """The tasks that `names` (tasks, groups, tags) stand for, in order and once each, and the names not found."""
    tasks: dict[str, TaskFile] = {}
    missing = []

    def visit(name: str, trail: tuple[str, ...]) -> None:
        entry = index.get(name)
        if entry is None:
            missing.append(name)
        elif entry.kind == "task":
            tasks.setdefault(name, entry)
        elif name not in trail:
            for member in entry.members:
                visit(member, (*trail, name))

    for name in names:
        visit(name, ())
    return list(tasks.values()), missing


def data_files(config: dict[str, Any]) -> list[str]:
    """Every file named by a task's dataset_kwargs.data_files (a string, a list, or a dict of split -> either)."""
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, dict):
        return [f for value in files.values() for f in _as_list(value)]
    return _as_list(files)


def localize(config: dict[str, Any], yaml_path: Path) -> dict[str, Any]:
    """The task config with its relative data files (and a relative local dataset_path) made absolute, relative to
    the folder of its YAML."""
    base = yaml_path.parent

    def absolute(value: str) -> str:
        return str(value) if Path(str(value)).expanduser().is_absolute() else str((base / str(value)).resolve())

    config = dict(config)
    kwargs = dict(config.get("dataset_kwargs") or {})
    files = kwargs.get("data_files")
    if isinstance(files, dict):
        kwargs["data_files"] = {split: [absolute(f) for f in _as_list(v)] if isinstance(v, list) else absolute(v) for split, v in files.items()}
    elif isinstance(files, list):
        kwargs["data_files"] = [absolute(f) for f in files]
    elif files is not None:
        kwargs["data_files"] = absolute(files)
    if kwargs:
        config["dataset_kwargs"] = kwargs
    path = config.get("dataset_path")
    if isinstance(path, str) and path not in FILE_BUILDERS and (base / path).is_dir():
        config["dataset_path"] = str((base / path).resolve())
    return config


def data_problem(entry: TaskFile) -> str | None:
    """Why the task would read anything but local files (named, with the file to write), or None."""
    config = localize(entry.config, entry.path)
    where = f"task {entry.name} ({entry.path})"
    if config.get("custom_dataset"):
        return None
    path = config.get("dataset_path")
    if path in FILE_BUILDERS:
        files = data_files(config)
        if not files:
            return f"{where} reads dataset_path: {path} without dataset_kwargs.data_files: name its local files there (e.g. data_files: {{test: test.jsonl}})"
        for file in files:
            if not glob.glob(file):
                return f"{where} reads {file}, which does not exist: write that file, or point dataset_kwargs.data_files at the task's local data"
        return None
    if isinstance(path, str) and Path(path).is_dir():
        return None
    return (
        f"{where} reads dataset_path={path} from the Hugging Face Hub, and curryTrain downloads nothing: save the data to a local "
        f"JSON or Parquet file and set dataset_path: json (or parquet) and dataset_kwargs: {{data_files: {{test: FILE}}}} in {entry.path}"
    )


def task_configs(names: list[str], task_paths: list[str]) -> list[dict[str, Any]]:
    """The local configs of the tasks `names` stand for, data files absolute (what the harness is handed).
    Raises ValueError with every problem (validation reports the same problems before a run)."""
    problems = task_problems(names, task_paths, "eval")
    if problems:
        raise ValueError("; ".join(problems))
    index, _ = build_index(task_paths)
    tasks, _ = expand(names, index)
    return [{**localize(entry.config, entry.path), "__yaml__": str(entry.path)} for entry in tasks]


def task_problems(names: list[str], task_paths: list[str], path: str = "eval") -> list[str]:
    """What stops the tasks `names` from running from local files, each naming the file or key and the fix."""
    index, problems = build_index(task_paths)
    tasks, missing = expand(names, index)
    for name in missing:
        problems.append(
            f"{path}.tasks: {name} is no task, group or tag of the shipped set or of {path}.task_paths={task_paths}: lm-eval's own tasks read their data "
            f"from the Hugging Face Hub, which curryTrain does not; write a local task (docs/evaluation.md) in a folder of {path}.task_paths"
        )
    for entry in tasks:
        if (problem := data_problem(entry)) is not None:
            problems.append(f"{path}.tasks: {problem}")
        if entry.config.get("output_type", "generate_until") not in ("loglikelihood", "loglikelihood_rolling", "multiple_choice", "generate_until"):
            problems.append(
                f"{path}.tasks: task {entry.name} ({entry.path}) has output_type={entry.config['output_type']}, which curryTrain's adapter does not run"
            )
    return problems


def text_files(location: str) -> list[Path]:
    """The non-empty text files of a held-out set: the file itself, or those below the folder (TEXT_SUFFIXES)."""
    path = Path(location).expanduser()
    found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES) if path.is_dir() else []
    return [p for p in found if p.stat().st_size > 0]


def text_set_problems(texts: dict[str, str], path: str = "eval.texts") -> list[str]:
    """Held-out text sets that do not exist or hold no text file."""
    problems = []
    for name, location in dict(texts).items():
        if not Path(str(location)).expanduser().exists():
            problems.append(f"{path}.{name}={location} does not exist: pass a text file or a folder of them")
        elif not text_files(str(location)):
            problems.append(f"{path}.{name}={location} holds no non-empty text file ({', '.join(TEXT_SUFFIXES)}): pass a text file or a folder of them")
    return problems
