"""The Hydra Sweeper plugin: Hydra calls setup() then sweep(arguments); the loop lives in currytrain.sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


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

    def sweep(self, arguments: list[str]) -> Any:
        from currytrain.sweep.driver import SweepLoop, check, merge_settings
        from currytrain.sweep.report import write_outputs

        assert self.config is not None and self.launcher is not None
        settings, paths, problems = merge_settings(self.config, self.keys)
        space = check(settings, paths, arguments, self.config, problems)
        loop = SweepLoop(settings, space, self.launcher, Path(str(self.config.hydra.sweep.dir)))
        try:
            study = loop.run()
        finally:
            if loop.study is not None:  # the results so far, also when the sweep stops on failures
                write_outputs(loop.study, loop.sweep_dir, loop.objectives)
        return study
