"""What every curryTrain Hydra app shares: the repo's launch.py and the launch.py of each project that
`currytrain init` makes. The app file keeps its own `@hydra.main` (its config folder and root config);
its task calls run_task(cfg), and its `__main__` block calls run_app(main).

Jobs raise typed outcomes (currytrain.errors); only run_app turns them into exit codes:
0 ok, 1 crash or failed run, 2 config error, 3 failed ladder gate, 4 abort.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from currytrain.errors import EXIT_CONFIG_ERROR, EXIT_SIGNAL_BASE, Interrupted, Outcome, PastHydra, Pruned

_task_started = False
_outcomes: list[Outcome] = []
"""Outcomes the jobs of this process raised, in order (a multirun may have several)."""


def run_task(cfg: DictConfig) -> float | None:
    """The body of the app's Hydra task: one run (or ladder, or sweep trial) of the composed config."""
    global _task_started
    _task_started = True
    from currytrain.run import run  # torch and friends load only once a run really starts

    try:
        return run(cfg)
    except Outcome as outcome:
        _outcomes.append(outcome)
        # The whole command ends: a single run, or a sweep the user stopped (its other jobs must not start).
        if HydraConfig.get().mode == RunMode.RUN or isinstance(outcome, Interrupted):
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
    # A pruned trial is how a sweep saves compute, not why the command failed: a sweep stopped by
    # max_failures exits with its failed trials' code (a crash: 1), not with a pruned trial's 4.
    failures = [outcome for outcome in _outcomes if not isinstance(outcome, Pruned)]
    return failures[0].exit_code if failures else 1


def torchrun_follower() -> bool:
    """A torchrun rank other than 0: it does not compose; it trains from rank 0's run folder."""
    from currytrain.workers import under_torchrun

    return under_torchrun() and int(os.environ["RANK"]) != 0


def run_app(main: Callable[[], None]) -> None:
    """Run the `@hydra.main` function `main` and exit with the code of how it ended."""
    from currytrain.config import CONF_DIR, broken_yaml_choices, unknown_list_choices, unparsable_overrides

    if torchrun_follower():
        from currytrain.run import run_worker
        from currytrain.workers import follow_rank_zero

        sys.exit(follow_rank_zero(run_worker))
    conf_dirs = [Path(sys.argv[0]).resolve().parent / "conf", CONF_DIR]
    if problems := unparsable_overrides(sys.argv[1:]) or unknown_list_choices(sys.argv[1:], conf_dirs) + broken_yaml_choices(sys.argv[1:], conf_dirs):
        print("\n".join(f"curryTrain: {problem}" for problem in problems), file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    try:
        main()
    except PastHydra as carried:  # validation before Hydra made any folder; a SLURM job's outcome
        print(carried.error, file=sys.stderr)
        sys.exit(carried.error.exit_code)
    except Outcome as outcome:  # HYDRA_FULL_ERROR=1 lets the job's exception through
        sys.exit(outcome.exit_code)
    except KeyboardInterrupt:  # Ctrl-C before training started, or twice: the run journaled it
        print("curryTrain: interrupted (Ctrl-C); nothing was saved at this point", file=sys.stderr)
        sys.exit(EXIT_SIGNAL_BASE + signal.SIGINT)
    except SystemExit as exit_:
        sys.exit(exit_code(exit_.code))
    finally:
        quick_exit()


def quick_exit() -> None:
    """Spare the interpreter's exit its walk over torch's objects (about 1 s of every run).

    Python's finalization runs the cycle collector over every live object, and torch's modules hold millions.
    Collect once here, so real garbage is finalized as usual, then move what survives into the permanent
    generation, which the exit's collections skip. Module teardown, atexit handlers and flushes still run.
    """
    import gc

    gc.collect()
    gc.freeze()
