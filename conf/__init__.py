"""curryTrain's config tree (Hydra's search path entry pkg://currytrain.conf for projects made by `currytrain init`),
and which tree a command run in some folder sees: the project's there, as its launch.py does.

CONF_DIR is curryTrain's folder. This module imports nothing, so every layer may ask where the tree is.
"""

import sys
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent
"""curryTrain's config tree: conf/ of the checkout (currytrain/conf links to it), package data when installed."""
ROOT_CONFIGS = ("project", "config")
"""The root config of an app's conf/: project.yaml in a project made by `currytrain init`, config.yaml in curryTrain's checkout."""


def app_root(start: Path | None = None) -> Path | None:
    """The folder of the launch.py a command run in `start` (default: the working directory) belongs to: the nearest
    folder at or above it holding launch.py and conf/project.yaml (a project) or conf/config.yaml (curryTrain's
    checkout); None elsewhere."""
    start = Path.cwd() if start is None else Path(start).resolve()
    for folder in (start, *start.parents):
        if (folder / "launch.py").is_file() and any((folder / "conf" / f"{name}.yaml").is_file() for name in ROOT_CONFIGS):
            return folder
    return None


def app_config(root: Path | None) -> tuple[Path, str]:
    """(config folder, root config name) that the launch.py of `root` composes; curryTrain's own without one."""
    if root is None:
        return CONF_DIR, "config"
    return root / "conf", next(name for name in ROOT_CONFIGS if (root / "conf" / f"{name}.yaml").is_file())


def enter_app(start: Path | None = None) -> Path | None:
    """See the project (or checkout) a command runs in as its launch.py does, and return its root (None outside one):
    the root goes first on sys.path, so its `experiments` package imports (configs name its classes as `_target_`,
    and its experiments/<name>/config.py schemas register). Its conf/ is app_config(root)."""
    root = app_root(start)
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
        stale = sys.modules.get("experiments")  # imported from elsewhere before: it would hide this project's
        if stale is not None and not any(Path(p).resolve().is_relative_to(root) for p in getattr(stale, "__path__", [])):
            for name in [name for name in sys.modules if name == "experiments" or name.startswith("experiments.")]:
                del sys.modules[name]
    return root
