"""The house's layering (.importlinter, docs/architecture.md) holds, and would catch a break."""

from __future__ import annotations

import ast
import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contract_layers() -> list[list[str]]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    rows = [line.strip() for line in parser["importlinter:contract:layers"]["layers"].strip().splitlines()]
    return [[room.strip().removeprefix("currytrain.") for room in row.split("|")] for row in rows]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120)


def test_contracts_are_kept():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    "module, line",
    [
        ("model/gqa.py", "from currytrain.trainer import trainer  # noqa"),  # a model reaching up into the loop
        ("model/moe.py", "from currytrain.model import gqa  # noqa"),  # one family importing another
        ("data/corpus.py", "import hydra  # noqa"),  # the data layer importing Hydra
    ],
)
def test_a_deliberate_break_fails_the_contracts(tmp_path, module, line):
    """A copy of the package with one bad import added: lint-imports (run there) fails and names it."""
    for room in ("currytrain", "conf"):  # currytrain/conf links to ../conf
        shutil.copytree(ROOT / room, tmp_path / room, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    path = tmp_path / "currytrain" / module
    path.write_text(path.read_text() + f"\n{line}\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and f"currytrain.{module[:-3].replace('/', '.')}" in result.stdout


def test_no_import_cycle():
    graph = grimp.build_graph("currytrain")
    cycles = [(a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a) if a != b and graph.chain_exists(importer=b, imported=a)]
    assert not cycles, f"import cycles through {sorted(cycles)[:5]}"


def test_every_room_is_placed():
    placed = {room for row in contract_layers() for room in row}
    rooms = {path.stem for path in (ROOT / "currytrain").iterdir() if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()}
    assert rooms == placed, f"unplaced rooms {sorted(rooms - placed)}, gone rooms {sorted(placed - rooms)}: update .importlinter and docs/architecture.md"


def test_architecture_doc_lists_the_contracts_layers():
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+?) \| .+ \|$", text, flags=re.M)
    documented = [re.findall(r"`([a-z_]+)`", rooms) for _, rooms in rows]
    assert documented == contract_layers()


def test_models_data_and_stats_do_not_import_torch_distributed():
    """import-linter names external packages only by their top name (torch), so this one is read from the source."""
    offenders = []
    for room in ("model", "data", "stats"):
        for path in (ROOT / "currytrain" / room).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                )
                offenders += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.startswith("torch.distributed")]
    assert not offenders
