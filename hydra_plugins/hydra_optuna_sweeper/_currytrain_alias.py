"""Marks this folder as curryTrain's alias of hydra-optuna-sweeper's import path (hydra_plugins.currytrain_sweeper.config)."""
