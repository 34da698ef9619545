"""Typed outcomes of a job. Jobs raise them; only the entry points (launch.py, the `currytrain` command)
turn them into exit codes, so one bad trial of a sweep fails that trial and not the whole process.

    0 ok | 1 crash (any other exception) or a failed run | 2 config error | 3 failed ladder gate | 4 abort
    128 + N: stopped by signal N (130 Ctrl-C, 143 SIGTERM, 138 SIGUSR1), as a shell reports it

Each outcome is a CompactHydraException: Hydra prints its message alone, without a traceback.
"""

from __future__ import annotations

from hydra.errors import CompactHydraException

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_CONFIG_ERROR = 2
EXIT_GATE_FAILED = 3
EXIT_ABORTED = 4
EXIT_SIGNAL_BASE = 128


class Outcome(CompactHydraException):
    """A job ending other than success, with the exit code its entry point returns."""

    exit_code = EXIT_CRASH


class ConfigError(Outcome, ValueError):
    """A problem the user fixes by changing the config or a path; the message names the key and the fix."""

    exit_code = EXIT_CONFIG_ERROR


class RunFailed(Outcome):
    """The run ended without a usable result (a final val loss that is not finite)."""

    exit_code = EXIT_CRASH


class GateFailed(Outcome):
    """A validation-ladder stage failed its gate."""

    exit_code = EXIT_GATE_FAILED


class Aborted(Outcome):
    """An abort condition stopped the run on purpose (journaled with its reason)."""

    exit_code = EXIT_ABORTED


class Pruned(Outcome):
    """The sweep's pruner stopped this trial early; the sweeper records it as PRUNED, not as a failure."""

    exit_code = EXIT_ABORTED


class Interrupted(Outcome):
    """A signal (Ctrl-C, SIGTERM, a scheduler's pre-emption warning) stopped the run between steps, after a
    checkpoint; the exit code is 128 + the signal's number."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = EXIT_SIGNAL_BASE + signum

    def __reduce__(self) -> tuple:  # pickled with its signal (a SLURM job's result travels as a pickle)
        return (type(self), (str(self), self.signum))


class InterruptedStarting(Interrupted):
    """A stop signal that arrived while a run was starting (before its training loop answers signals): nothing was
    trained or saved; the run journals it as `interrupted` with no checkpoint."""


class PastHydra(BaseException):
    """An outcome carried past Hydra, which prints any Exception a job raises and exits 1 (or, raised in a
    callback, turns it into a warning): it derives from BaseException, as SystemExit does. launch.py prints
    `error` and exits with its code."""

    def __init__(self, error: Outcome):
        super().__init__(str(error))
        self.error = error


class ConfigRejected(PastHydra):
    """A ConfigError found by the validation callback, before Hydra creates any folder; launch.py exits 2."""


class Crashed(PastHydra):
    """curryTrain's own machinery raised before any job ran (a bug, not a problem of the config): the command exits 1
    with the traceback, where Hydra's exit 1 before a job would read as a config error (2), or a warning."""

    def __init__(self, error: BaseException, what: str = "the command"):
        import traceback

        trace = "".join(traceback.format_exception(error))
        super().__init__(RunFailed(f"curryTrain: {what} failed; nothing ran. This is a bug of curryTrain:\n{trace}"))


class ValidationCrashed(Crashed):
    """Validation itself raised: Hydra would have warned about its callback and run the job unvalidated."""

    def __init__(self, error: BaseException):
        super().__init__(error, "validating the config")


class JobFailed(PastHydra):
    """The outcome of a job that ran in another process (a SLURM job), raised again in the process that
    launched it when Hydra reads the job's result, so launch.py exits with that outcome's code."""


def exit_code_of(error: BaseException) -> int:
    return error.exit_code if isinstance(error, Outcome) else EXIT_CRASH


def format_problems(problems: list[str]) -> str:
    """Every problem of a config, one line each, as ConfigError's message."""
    noun = "problem" if len(problems) == 1 else "problems"
    lines = [f"curryTrain: the config has {len(problems)} {noun}:"]
    lines += [f"  - {problem}" for problem in problems]
    return "\n".join(lines)
