"""curryTrain's SLURM launcher for Hydra (`hydra/launcher=slurm`): hydra-submitit-launcher's, with the behaviour
of currytrain/cluster/launcher.py. Hydra imports every module of the hydra_plugins namespace when it starts, so
nothing here imports submitit or curryTrain at module level."""
