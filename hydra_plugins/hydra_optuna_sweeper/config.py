"""hydra-optuna-sweeper's config module path: its Direction, and its sweeper config as curryTrain's (see this
package's __init__). Nothing is registered here: hydra_plugins.currytrain_sweeper.config registers the names."""

from enum import Enum

from hydra_plugins.currytrain_sweeper.config import OptunaCompatConf as OptunaSweeperConf


class Direction(Enum):
    minimize = 1
    maximize = 2


__all__ = ["Direction", "OptunaSweeperConf"]
