"""Stopping a run on a signal without losing it: Ctrl-C (SIGINT), SIGTERM (what `kill`, SLURM and most
schedulers send before they end a job) and SIGUSR1 (SLURM's `--signal=USR1@<seconds>` warning) are noted,
the step in progress finishes, and the Trainer saves a checkpoint and stops (Trainer.stop_on_signal).

Only a single-process run handles them here. Workers started by torch's elastic agent are stopped by the
agent with SIGTERM when a peer fails, perhaps inside a collective, where a Python handler would never run;
they keep the default actions (currytrain.parallel.workers).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class StopSignals:
    """The first stop signal received while installed; a second Ctrl-C stops at once (KeyboardInterrupt)."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None

    @contextlib.contextmanager
    def installed(self, enabled: bool = True) -> Iterator[StopSignals]:
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
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
