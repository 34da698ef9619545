"""`currytrain init DIR`: a new project whose conf/ adds to curryTrain's config tree through Hydra's search
path (so it keeps every built-in option and gets curryTrain's upgrades), or, with copy_framework, a project
that carries its own copy of curryTrain's source to edit.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import currytrain
from currytrain.errors import ConfigError
from currytrain.project.files import render, write_files

PROJECT_TEMPLATES = {
    "launch.py": "launch.py.tmpl",
    "conf/project.yaml": "project.yaml.tmpl",
    "conf/experiment/baseline.yaml": "baseline.yaml.tmpl",
    "experiments/__init__.py": "experiments_init.py.tmpl",
    "tests/conftest.py": "conftest.py.tmpl",
    "tests/test_baseline.py": "test_baseline.py.tmpl",
    "README.md": "README.md.tmpl",
    "pyproject.toml": "pyproject.toml.tmpl",
    ".gitignore": "gitignore.tmpl",
}
"""Project path -> its template under templates/project/."""

FRAMEWORK_NOTE = """

This project carries its own copy of curryTrain in `currytrain/` (made by `currytrain init --copy-framework`):
edit it freely. `launch.py` and the tests import this copy, not an installed curryTrain."""

COPIED_PACKAGE_DATA = """
[tool.setuptools.package-data]
"currytrain.conf" = ["**/*.yaml"]
"currytrain.project" = ["templates/**/*"]
"""


def init_project(folder: Path, *, force: bool = False, copy_framework: bool = False) -> list[Path]:
    """Write a new project into folder (made if missing); returns the files written.

    Refuses a folder that is not empty unless force, and then replaces only the files it writes.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} is a file: pass a new or empty folder to currytrain init")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise ConfigError(f"{folder} is not empty: nothing was written; pass a new or empty folder, or --force to write the project's files into it")
    files = project_files(folder.resolve().name, copy_framework)
    if copy_framework:
        files.update(framework_files())
    return write_files(folder, files, force=force)


def project_files(folder_name: str, copy_framework: bool) -> dict[str, str]:
    values = {
        "project": re.sub(r"[^A-Za-z0-9._-]+", "-", folder_name).strip("-._") or "experiments",
        "dependencies": ", ".join(f'"{requirement}"' for requirement in dependencies(copy_framework)),
        "packages": '"experiments*", "currytrain*"' if copy_framework else '"experiments*"',
        "package_data": COPIED_PACKAGE_DATA if copy_framework else "",
        "framework_note": FRAMEWORK_NOTE if copy_framework else "",
    }
    return {path: render(f"project/{template}", **values) for path, template in PROJECT_TEMPLATES.items()}


def dependencies(copy_framework: bool) -> list[str]:
    """curryTrain itself, or (for a project with its own copy) what curryTrain depends on."""
    if not copy_framework:
        return [f"currytrain>={metadata.version('currytrain')}"]
    return [requirement for requirement in metadata.requires("currytrain") or [] if "extra ==" not in requirement]


def framework_files() -> dict[str, str]:
    """Every source, config and template file of the running curryTrain, keyed by its path in the project."""
    package = Path(currytrain.__file__).resolve().parent
    files = {}
    # followlinks: in a checkout currytrain/conf links to conf/, and the copy holds the config files themselves.
    for folder, subfolders, names in os.walk(package, followlinks=True):
        subfolders[:] = [name for name in subfolders if name != "__pycache__"]
        for name in names:
            path = Path(folder, name)
            files[f"currytrain/{path.relative_to(package).as_posix()}"] = path.read_text()
    return files
