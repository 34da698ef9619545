"""hydra-optuna-sweeper's sweeper module path: curryTrain's sweeper (see this package's __init__)."""

from hydra_plugins.currytrain_sweeper.sweeper import OptunaSweeper

__all__ = ["OptunaSweeper"]
