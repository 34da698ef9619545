"""Stopping a run on a signal without losing it: Ctrl-C (SIGINT), SIGTERM (what `kill`, SLURM and most
schedulers send before they end a job), SIGUSR1 (SLURM's `--signal=USR1@<seconds>` warning, `scancel
--signal=USR1`) and SIGUSR2 (the warning submitit asks SLURM for before a job's time limit) are noted, the step
in progress finishes, and the Trainer saves a checkpoint and stops (Trainer.stop_on_signal).

A single-process run handles all three here and stops after the step in progress, with no collective
and no host sync added to any step.

In a multi-worker run the ranks must stop after the same step, since saving is collective. Each rank
notes what it received (SIGINT: Ctrl-C reaches every process of the terminal; SIGUSR1), and the launcher of
`parallel.nproc=N` writes the signal it received into a stop file (STOP_FILE_ENV names it); at each fetch
step (a log, eval or checkpoint step) the ranks all-reduce (max) the signal each has seen, so they agree on
the step to stop after. Workers started by torch's elastic agent keep SIGTERM's default action: the agent
stops the workers of a failed peer with SIGTERM, perhaps while they wait inside a collective, where a Python
handler would never run; a SIGTERM for the whole run goes to the launcher (currytrain.workers). SLURM's tasks
(one process per rank, no agent) handle SIGTERM too: SLURM sends it to every task of a job it requeues,
pre-empts or cancels, and they agree on a step to checkpoint after as for the other signals.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
WORKER_SIGNALS = (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
"""What a worker of torch's elastic agent handles itself (SIGTERM stays the agent's way to stop it)."""
STOP_FILE_ENV = "CURRYTRAIN_STOP_FILE"
"""The file the launcher of the workers writes a stop signal's name into (set by the launcher for its workers)."""


def handled_signals(world_size: int) -> tuple[signal.Signals, ...]:
    """The stop signals this training process handles: all of them alone or as a SLURM task, WORKER_SIGNALS
    as a worker of torch's elastic agent (launch.py's parallel.nproc=N, torchrun)."""
    return WORKER_SIGNALS if world_size > 1 and "TORCHELASTIC_RUN_ID" in os.environ else STOP_SIGNALS


def stop_file_signal() -> signal.Signals | None:
    """The signal the launcher of this worker received, from its stop file; None when it received none."""
    path = os.environ.get(STOP_FILE_ENV)
    if not path:
        return None
    try:
        name = Path(path).read_text().strip()
    except FileNotFoundError:
        return None
    return signal.Signals[name] if name in signal.Signals.__members__ else signal.SIGTERM


class StopSignals:
    """The first stop signal received while installed; a second Ctrl-C stops at once (KeyboardInterrupt)."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None

    @contextlib.contextmanager
    def installed(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[StopSignals]:
        if not signals or threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {signum: signal.getsignal(signum) for signum in signals}
        for signum in signals:
            signal.signal(signum, self._note)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _note(self, signum: int, frame: object) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: stop now, without the checkpoint
        self.received = signal.Signals(signum)
        log.warning("%s received: stopping after this step (with a checkpoint; Ctrl-C again to stop at once)", self.received.name)
