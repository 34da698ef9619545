"""curryTrain's Optuna sweeper for Hydra (selected by `sweep=<preset>`, or `hydra/sweeper=currytrain`).

Hydra imports every module of the hydra_plugins namespace when it starts, so nothing here imports optuna or
torch at module level: they load only when a sweep runs. curryTrain ships no file under another plugin's
folder: hydra-optuna-sweeper's name (`hydra/sweeper=optuna`, its class path) is offered only while that
plugin is not installed (config.official_plugin_installed).
"""
