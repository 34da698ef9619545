"""What every curryTrain Hydra app shares: the repo's launch.py and the launch.py of each project that
`currytrain init` makes. The app file keeps its own `@hydra.main` (its config folder and root config);
its task calls run_task(cfg), and its `__main__` block calls run_app(main).

Jobs raise typed outcomes (currytrain.errors); only run_app turns them into exit codes:
0 ok, 1 crash or failed run, 2 config error, 3 failed ladder gate, 4 abort.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from currytrain.errors import (
    EXIT_CONFIG_ERROR,
    EXIT_SIGNAL_BASE,
    Aborted,
    ConfigError,
    ConfigRejected,
    Interrupted,
    Outcome,
    PastHydra,
    Pruned,
    RunFailed,
    format_problems,
)

_task_started = False
_outcomes: list[Outcome] = []
"""Outcomes the jobs of this process raised, in order (a multirun may have several)."""
_failed_runs: list[Path] = []
"""Run folders of the jobs that crashed, diverged or were aborted: `currytrain diagnose` explains each."""


def run_task(cfg: DictConfig) -> float | None:
    """The body of the app's Hydra task: one run (or ladder, or sweep trial) of the composed config."""
    global _task_started
    _task_started = True
    from currytrain.run import run  # torch and friends load only once a run really starts

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        return run(cfg)
    except Exception as error:
        if not isinstance(error, Outcome) or isinstance(error, RunFailed | Aborted):
            _failed_runs.append(run_dir)
        if not isinstance(error, Outcome):
            raise  # a crash: Hydra prints its traceback, and run_app the diagnose command after it
        outcome = error
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
    from currytrain.conf import CONF_DIR
    from currytrain.config import broken_yaml_choices, unknown_list_choices, unparsable_overrides

    if torchrun_follower():
        from currytrain.run import run_worker
        from currytrain.workers import follow_rank_zero

        sys.exit(follow_rank_zero(run_worker))
    conf_dirs = [Path(sys.argv[0]).resolve().parent / "conf", CONF_DIR]
    if problems := unparsable_overrides(sys.argv[1:]) or unknown_list_choices(sys.argv[1:], conf_dirs) + broken_yaml_choices(sys.argv[1:], conf_dirs):
        print("\n".join(f"curryTrain: {problem}" for problem in problems), file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    try:
        with curry_composition_errors():
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
        code = exit_code(exit_.code)
        point_to_diagnose(code)
        sys.exit(code)
    finally:
        quick_exit()


def point_to_diagnose(code: int | str | None) -> None:
    """After a crash, a diverged or an aborted run, the command that says what went wrong and the fix (the last
    lines a user sees, under the traceback)."""
    if code in (0, EXIT_CONFIG_ERROR, None):
        return
    for run_dir in dict.fromkeys(_failed_runs):  # a sweep's failed trials, once each
        if (run_dir / "journal.jsonl").is_file():
            shown = run_dir.relative_to(Path.cwd()) if run_dir.is_relative_to(Path.cwd()) else run_dir
            print(f"curryTrain: what went wrong and the fix: currytrain diagnose {shown}", file=sys.stderr)


@contextlib.contextmanager
def curry_composition_errors():
    """Inside the block Hydra reports the errors of composing the config in curryTrain's form (the key, did you
    mean, the fix: currytrain.compose_errors) instead of its own ("To append to your config use +key=value"). Hydra
    prints whatever its run_and_report catches and exits 1, so the translation wraps what that function runs; a job's
    own errors, once a task started, pass through untouched."""
    from hydra._internal import utils as hydra_utils

    from currytrain.compose_errors import composition_problem

    report = hydra_utils.run_and_report

    def translated(func: Callable[[], Any]) -> Any:
        def composing() -> Any:
            try:
                return func()
            except Exception as error:
                problem = None if _task_started else composition_problem(error)
                if problem is None:
                    raise
                raise ConfigRejected(ConfigError(format_problems([problem]))) from None  # past Hydra's report: run_app prints it, exit 2

        return report(composing)

    hydra_utils.run_and_report = translated
    try:
        yield
    finally:
        hydra_utils.run_and_report = report


def quick_exit() -> None:
    """Spare the interpreter's exit its walk over torch's objects (about 1 s of every run).

    Python's finalization runs the cycle collector over every live object, and torch's modules hold millions.
    Collect once here, so real garbage is finalized as usual, then move what survives into the permanent
    generation, which the exit's collections skip. Module teardown, atexit handlers and flushes still run.
    """
    import gc

    gc.collect()
    gc.freeze()
