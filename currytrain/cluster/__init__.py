"""SLURM, as curryTrain drives it: `slurm` asks the controller through its own commands (squeue, scontrol,
sbatch) without submitit or torch (job states, a node's address, a requeue, the record of a multirun's jobs);
`launcher` is the Hydra launcher behind `hydra/launcher=slurm` (hydra-submitit-launcher's, with sbatch's
refusals as config errors, the jobs' states on the console, and requeued jobs that resume)."""
