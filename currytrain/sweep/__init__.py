"""The sweep group (conf/sweep/): Optuna studies run by the Hydra sweeper in hydra_plugins/currytrain_sweeper.

config (the typed `sweep` node) and checks (bad input, exit 2) -> space (Hydra sweep syntax to Optuna
distributions) -> driver (the loop: study, trials, batches) with asynchronous (submitit, n_jobs in flight)
-> study (storage, outcomes from jobs and journals, recovery) ; pruning (the StepHook inside a trial's job)
; report (optimization_results.yaml, report.md, history PNG). See docs/sweeps.md.
"""
