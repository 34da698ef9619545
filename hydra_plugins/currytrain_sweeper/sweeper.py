"""The Hydra Sweeper plugin: Hydra calls setup() then sweep(arguments); the loop lives in currytrain.sweep."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hydra_plugins.currytrain_sweeper.config import OFFICIAL_MODULE, OFFICIAL_PACKAGE, checkout_alias, official_plugin_installed

OPTUNA_MIN_MAJOR = 4


class CurryTrainSweeper(Sweeper):
    """An Optuna study over Hydra jobs: pruning, total-trial resume, failed trials recorded with their reason."""

    def __init__(self, **keys: Any) -> None:
        self.keys = keys
        self.config: DictConfig | None = None
        self.launcher = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context, task_function=task_function)

    def sweep(self, arguments: list[str]) -> None:
        """Run the study; a config error (every problem at once, or a task whose returns do not match the
        directions) prints its message and exits 2, in a plain Hydra app as in curryTrain's."""
        from currytrain.errors import EXIT_CONFIG_ERROR, ConfigError, Crashed, Outcome

        try:
            self._sweep(arguments)
        except ConfigError as error:
            print(error, file=sys.stderr)
            sys.exit(EXIT_CONFIG_ERROR)
        except Outcome:
            raise
        except Exception as error:  # a bug of the sweeper: exit 1 with its traceback, not Hydra's 1 that reads as a config error
            raise Crashed(error, "the sweeper") from error

    def _sweep(self, arguments: list[str]) -> None:
        check_optuna()
        from currytrain.sweep.driver import SweepLoop, check, merge_settings
        from currytrain.sweep.report import write_outputs

        assert self.config is not None and self.launcher is not None
        settings, paths, problems = merge_settings(self.config, self.keys)
        space = check(settings, paths, arguments, self.config, problems)
        loop = SweepLoop(settings, space, self.launcher, Path(str(self.config.hydra.sweep.dir)), config=self.config)
        confirmation = None
        try:
            loop.run()
            confirmation = loop.confirm()
        finally:
            if loop.study is not None:  # the results so far, also when the sweep stops on failures
                write_outputs(loop.study, loop.sweep_dir, loop.objectives, confirmation)


def check_optuna() -> None:
    """curryTrain's sweeper needs Optuna 4 or later; hydra-optuna-sweeper 1.3 pins Optuna below 3, so an
    environment with that plugin may hold an Optuna this sweeper cannot use."""
    from importlib import metadata

    from currytrain.errors import ConfigError

    try:
        version = metadata.version("optuna")
    except metadata.PackageNotFoundError:
        version = None
    if version is None or int(version.split(".")[0]) < OPTUNA_MIN_MAJOR:
        found = f"Optuna {version} is installed" if version else "Optuna is not installed"
        official = " (hydra-optuna-sweeper 1.3 pins optuna<3: use hydra/sweeper=optuna for that plugin, or give curryTrain its own environment)"
        raise ConfigError(
            f"curryTrain's sweeper needs optuna>={OPTUNA_MIN_MAJOR}, but {found}: pip install 'currytrain[sweep]'"
            + (official if official_plugin_installed() else "")
        )


def _offer_official_class_path() -> type[CurryTrainSweeper]:
    """This sweeper under hydra-optuna-sweeper's class path, for configs that name it (`_target_: hydra_plugins.
    hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper`, as lightning-hydra-template's do), while that plugin is
    not installed. Hydra registers plugin classes by the module and name they carry and finds a `_target_` by
    attribute lookup from the `hydra_plugins` package, so the class carries that plugin's module name and the
    package gets an in-memory attribute chain to it (an installed wheel: nothing is written under that plugin's
    folder, nothing is put in sys.modules); in a checkout, hydra_plugins/hydra_optuna_sweeper imports and hands
    out this class. None of this happens with that plugin installed."""
    klass = type(
        "OptunaSweeper",
        (CurryTrainSweeper,),
        {"__module__": OFFICIAL_MODULE, "__doc__": "curryTrain's sweeper under hydra-optuna-sweeper's class path (that plugin is not installed)."},
    )
    if checkout_alias():  # a checkout: that path imports, and hands out this class
        return klass
    package, module = ModuleType(OFFICIAL_PACKAGE), ModuleType(OFFICIAL_MODULE)
    module.OptunaSweeper = klass
    package.optuna_sweeper = module
    setattr(sys.modules["hydra_plugins"], OFFICIAL_PACKAGE.rpartition(".")[2], package)
    return klass


if not official_plugin_installed():
    OptunaSweeper = _offer_official_class_path()
