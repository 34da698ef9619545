"""hydra-optuna-sweeper's module name, kept so that configs naming its sweeper class run unchanged.

The official plugin cannot be installed beside curryTrain (it pins optuna < 3); configs that name
`hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper` get curryTrain's sweeper instead.
"""
