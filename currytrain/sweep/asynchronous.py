"""Asynchronous trials with hydra-submitit-launcher: keep n_jobs trials in flight, hand out a new one as soon
as one ends (Hydra's Launcher.launch waits for a whole batch, so a pruned trial's slot would idle until the
slowest trial of its batch ends).

The jobs are the launcher's own (its __call__ composes the trial's config and runs it with Hydra's run_job),
submitted one at a time to the executor the launcher would build for a batch.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

POLL_S = 0.5
"""How often finished jobs are looked for."""


def is_submitit(launcher: Any) -> bool:
    """A hydra-submitit-launcher launcher (its own, or curryTrain's slurm one built on it). By its class names:
    Hydra's plugin scan executes the plugin's module again after curryTrain's launcher module imported it, so
    the class objects differ and isinstance would not tell."""
    return any(cls.__name__ == "BaseSubmititLauncher" for cls in type(launcher).__mro__)


def slurm_launcher(launcher: Any) -> bool:
    """A submitit launcher for SLURM (hydra/launcher=slurm, or the plugin's submitit_slurm): its jobs are
    submitted and watched with currytrain.cluster.launcher's executor (squeue, no sacct)."""
    return getattr(launcher, "_EXECUTOR", None) == "slurm"


def build_executor(launcher: Any) -> Any:
    """The submitit executor with the launcher's parameters, as its launch() sets it up for a batch."""
    import submitit

    if slurm_launcher(launcher):
        from currytrain.cluster.launcher import build_executor as slurm_executor

        return slurm_executor(launcher)
    from omegaconf import OmegaConf

    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    kind, params = launcher._EXECUTOR, dict(launcher.params)
    init = {"folder": params.pop("submitit_folder")}
    if "max_num_timeout" in params:
        init[f"{kind}_max_num_timeout"] = params.pop("max_num_timeout")
    executor = submitit.AutoExecutor(cluster=kind, **init)
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{key if key in shared else f"{kind}_{key}": value for key, value in params.items()})
    return executor


class InFlight:
    """Trials submitted as single submitit jobs; `finished()` returns those that ended, with their JobReturn.
    On SLURM (hydra/launcher=slurm) the launcher's JobWatch shows each job's state as it changes and reads
    the results of trials that run several tasks; sbatch refusing a trial's job is a ConfigError."""

    def __init__(self, launcher: Any):
        from currytrain.cluster.launcher import JobWatch

        self.launcher = launcher
        self.executor = build_executor(launcher)
        self.jobs: dict[int, Any] = {}
        self.watch = JobWatch(launcher.config.hydra.sweep.dir) if slurm_launcher(launcher) else None

    def __len__(self) -> int:
        return len(self.jobs)

    def submit(self, number: int, overrides: list[str]) -> None:
        from hydra.core.singleton import Singleton

        log.info("\t#%d : %s", number, " ".join(o for o in overrides if not o.startswith("++hydra.job.env_set")))
        from currytrain.cluster.launcher import sbatch_refusals

        with sbatch_refusals() if self.watch else contextlib.nullcontext():
            job = self.executor.submit(self.launcher, list(overrides), "hydra.sweep.dir", number, f"job_id_for_{number}", Singleton.get_state())
        self.jobs[number] = job
        if self.watch:
            self.watch.add(job, number, f"trial {number}")

    def finished(self) -> list[tuple[int, Any]]:
        """Wait until at least one job ended; each as (trial number, JobReturn or the exception its job died of)."""
        while True:
            if self.watch:
                self.watch.poll()
            done = [number for number, job in self.jobs.items() if (self.watch.done(job) if self.watch else job.done())]
            if done:
                return [(number, self.watch.job_return(job) if self.watch else _result(job)) for number, job in ((n, self.jobs.pop(n)) for n in done)]
            time.sleep(POLL_S)


def _result(job: Any) -> Any:
    try:
        return job.result()
    except Exception as error:  # the job process died (killed, out of memory): submitit raises its reason
        return error
