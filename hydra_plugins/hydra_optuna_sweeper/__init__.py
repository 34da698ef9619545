"""hydra-optuna-sweeper's import path, in a checkout of curryTrain only (the wheel does not ship this folder, so
an installed curryTrain never shares a file with that plugin: docs/sweeps.md).

In a checkout (`make setup`'s editable install), code and tests written for that plugin import
`hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper` and `.config.Direction`; these modules hand
them curryTrain's sweeper. Where the plugin itself is installed, this package defers to it: its folder becomes
this package's path, so every submodule (`optuna_sweeper`, `config`, `_impl`) is the plugin's own.
"""

from pathlib import Path

import hydra_plugins


def official_folder() -> Path | None:
    """The installed plugin's folder on the hydra_plugins path (one without this alias's marker file)."""
    for entry in hydra_plugins.__path__:
        folder = Path(entry) / "hydra_optuna_sweeper"
        if (folder / "optuna_sweeper.py").is_file() and not (folder / "_currytrain_alias.py").is_file():
            return folder
    return None


_official = official_folder()
if _official is not None:
    __path__ = [str(_official)]
    exec(compile((_official / "__init__.py").read_text(), str(_official / "__init__.py"), "exec"))
