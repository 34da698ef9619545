"""`_target_: hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper` (hydra-optuna-sweeper configs)."""

from hydra_plugins.currytrain_sweeper.sweeper import CurryTrainSweeper


class OptunaSweeper(CurryTrainSweeper):
    """curryTrain's sweeper under hydra-optuna-sweeper's class name."""
