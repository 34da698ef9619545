"""Asynchronous trials with hydra-submitit-launcher: keep n_jobs trials in flight, hand out a new one as soon
as one ends (Hydra's Launcher.launch waits for a whole batch, so a pruned trial's slot would idle until the
slowest trial of its batch ends).

The jobs are the launcher's own (its __call__ composes the trial's config and runs it with Hydra's run_job),
submitted one at a time to the executor the launcher would build for a batch.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger(__name__)

POLL_S = 0.5
"""How often finished jobs are looked for."""


def is_submitit(launcher: Any) -> bool:
    try:
        from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
    except ImportError:
        return False
    return isinstance(launcher, BaseSubmititLauncher)


def build_executor(launcher: Any) -> Any:
    """The submitit executor with the launcher's parameters, as its launch() sets it up for a batch."""
    import submitit
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
    """Trials submitted as single submitit jobs; `finished()` returns those that ended, with their JobReturn."""

    def __init__(self, launcher: Any):
        self.launcher = launcher
        self.executor = build_executor(launcher)
        self.jobs: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.jobs)

    def submit(self, number: int, overrides: list[str]) -> None:
        from hydra.core.singleton import Singleton

        log.info("\t#%d : %s", number, " ".join(o for o in overrides if not o.startswith("++hydra.job.env_set")))
        self.jobs[number] = self.executor.submit(self.launcher, list(overrides), "hydra.sweep.dir", number, f"job_id_for_{number}", Singleton.get_state())

    def finished(self) -> list[tuple[int, Any]]:
        """Wait until at least one job ended; each as (trial number, JobReturn or the exception its job died of)."""
        while True:
            done = [number for number, job in self.jobs.items() if job.done()]
            if done:
                return [(number, _result(self.jobs.pop(number))) for number in done]
            time.sleep(POLL_S)


def _result(job: Any) -> Any:
    try:
        return job.result()
    except Exception as error:  # the job process died (killed, out of memory): submitit raises its reason
        return error
