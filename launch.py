"""curryTrain's one Hydra app: a training run, a validation ladder or a sweep, by the selected config.

    python launch.py                                   # debug GQA on the embedded corpus
    python launch.py model/size=tiny optimizer.lr=1e-3 # overrides
    python launch.py --cfg job                         # print the composed config
    python launch.py parallel=fsdp parallel.nproc=2    # starts 2 workers itself
    torchrun --nproc_per_node 2 launch.py parallel=ddp # rank 0 composes; the others read its run folder

Jobs raise typed outcomes (currytrain.errors); this entry point alone turns them into exit codes:
0 ok, 1 crash or failed run, 2 config error, 3 failed ladder gate, 4 abort.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from currytrain.config import register_configs
from currytrain.errors import EXIT_CONFIG_ERROR, ConfigRejected, Outcome

register_configs()

_task_started = False
_outcomes: list[Outcome] = []
"""Outcomes the jobs of this process raised, in order (a multirun may have several)."""


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    global _task_started
    _task_started = True
    from currytrain.run import run  # torch and friends load only once a run really starts

    try:
        return run(cfg)
    except Outcome as outcome:
        _outcomes.append(outcome)
        if HydraConfig.get().mode == RunMode.RUN:  # the whole command: its message and its exit code
            print(outcome, file=sys.stderr)
            sys.exit(outcome.exit_code)
        raise  # Hydra records the job as failed, the other jobs still run, and prints the message


def exit_code(hydra_code: int | str | None) -> int | str | None:
    """Hydra exits 1 for every failure it reports: composition errors and failed validation before any job
    started (config errors, 2) and jobs that raised (their outcome's code; a crash stays 1)."""
    if hydra_code != 1:
        return hydra_code
    if not _task_started:
        return EXIT_CONFIG_ERROR
    return _outcomes[0].exit_code if _outcomes else 1


def torchrun_follower() -> bool:
    """A torchrun rank other than 0: it does not compose; it trains from rank 0's run folder."""
    from currytrain.parallel.workers import under_torchrun

    return under_torchrun() and int(os.environ["RANK"]) != 0


if __name__ == "__main__":
    if torchrun_follower():
        from currytrain.parallel.workers import follow_rank_zero

        sys.exit(follow_rank_zero())
    try:
        main()
    except ConfigRejected as rejected:  # validation before Hydra made any folder
        print(rejected.error, file=sys.stderr)
        sys.exit(rejected.error.exit_code)
    except Outcome as outcome:  # HYDRA_FULL_ERROR=1 lets the job's exception through
        sys.exit(outcome.exit_code)
    except SystemExit as exit_:
        sys.exit(exit_code(exit_.code))
