"""The Launcher class behind conf/hydra/launcher/slurm.yaml. Hydra instantiates launchers from the hydra_plugins
package only; the behaviour lives in currytrain.cluster.launcher, imported when a method runs. Without the slurm
extra (hydra-submitit-launcher) there is nothing to extend, and no class is defined."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
except ImportError:  # pip install -e ".[slurm]" adds it
    SlurmLauncher = None

if SlurmLauncher is not None:

    class CurryTrainSlurmLauncher(SlurmLauncher):
        """hydra-submitit-launcher's SlurmLauncher: sbatch's refusals exit 2, each job's state shown as it
        changes, failed jobs exit with their outcome's code, requeued jobs resume (currytrain.cluster.launcher)."""

        def executor(self) -> Any:
            from currytrain.cluster.launcher import build_executor

            return build_executor(self)

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
            from currytrain.cluster.launcher import launch

            return launch(self, job_overrides, initial_job_idx)

        def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str, singleton_state: dict) -> Any:
            from hydra.core.singleton import Singleton
            from hydra.core.utils import setup_globals

            from currytrain.cluster.launcher import run_in_task

            Singleton.set_state(singleton_state)
            setup_globals()
            return run_in_task(self, sweep_overrides, job_dir_key, job_num)
