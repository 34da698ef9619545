"""Components that fail on purpose, for tests of how a run ends. Configs reach them with build.allow=[tests.faulty.<the class>] on the command line."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from currytrain.data.corpus import StdlibBytes
from currytrain.model.gqa import GQATransformer


class _QuietLogger:
    """The logger protocol doing nothing; the faults below each act at one moment of the run."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_config(self, config: Mapping) -> None:
        pass

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        pass

    def log_histogram(self, name, values, step: int) -> None:
        pass

    def close(self, status: str = "finished") -> None:
        pass


class CrashingLogger(_QuietLogger):
    """A logger whose log_metrics raises at step `fail_at`: a crash in the middle of training."""

    closed: list[str] = []

    def __init__(self, run_dir: str, fail_at: int = 3):
        self.run_dir, self.fail_at = run_dir, fail_at

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if step >= self.fail_at:
            raise RuntimeError(f"logger exploded at step {step}")

    def close(self, status: str = "finished") -> None:
        CrashingLogger.closed.append((self.run_dir, status))


class PoisonedGQA(GQATransformer):
    """A GQA decoder whose `poison_at`-th training forward pass returns NaN logits: one bad batch mid-run."""

    def __init__(self, *args, poison_at: int = 3, **kwargs):
        super().__init__(*args, **kwargs)
        self.poison_at, self.calls = poison_at, 0

    def forward(self, tokens):
        logits = super().forward(tokens)
        if self.training:
            self.calls += 1
            if self.calls == self.poison_at:
                return logits * float("nan")
        return logits


class RejectingLogger:
    """A logger whose construction raises a ConfigError: a config problem only a worker can find (loggers
    are built on rank 0 alone, so the other ranks wait for it in a collective)."""

    def __init__(self, run_dir: str):
        from currytrain.errors import ConfigError

        raise ConfigError("logger.reject: this logger refuses every run: remove +logger.reject")


class SlowLogger(_QuietLogger):
    """A logger that sleeps `seconds` per log_metrics call: a run slow enough to be interrupted on cue.
    $SLOW_LOGGER_SECONDS, where set, wins: one process of a sweep can run slower than the others without a config
    of its own (a study refuses a sweeper whose overrides differ from its creator's)."""

    def __init__(self, run_dir: str, seconds: float = 0.1):
        self.seconds = float(os.environ.get("SLOW_LOGGER_SECONDS", seconds))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        time.sleep(self.seconds)


class HangingBytes(StdlibBytes):
    """The stdlib byte corpus, except that rank `hang_rank` hangs for `hang_seconds` reading the training
    batches of step `hang_at`: a straggler the other ranks wait for in their next collective."""

    def __init__(self, *args, hang_rank: int = 1, hang_at: int = 4, hang_seconds: float = 600.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.hang_rank, self.hang_at, self.hang_seconds = hang_rank, hang_at, hang_seconds

    def batch(self, split, step, micro, batch_size, rank=0, num_ranks=1):
        if split == "train" and step == self.hang_at and rank == self.hang_rank:
            time.sleep(self.hang_seconds)
        return super().batch(split, step, micro, batch_size, rank, num_ranks)


def _kill_self() -> None:
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


class Killer(_QuietLogger):
    """SIGKILLs its own process at step `at`, at the moment `where` names (a power cut, an OOM killer):
    step: after the optimizer step, before any checkpoint of that step;
    eval: inside the evaluation of that step (evaluations happen at trainer.eval_every);
    checkpoint: inside the save of that step, after DCP wrote the shards and before the COMPLETE marker."""

    def __init__(self, run_dir: str, at: int = 3, where: str = "step"):
        import currytrain.checkpoint as checkpoint
        import currytrain.trainer.trainer as trainer

        self.at, self.where, self.step = at, where, 0
        if where == "eval":
            evaluate = trainer.Trainer.evaluate

            def killing_evaluate(trainer_self, *args, **kwargs):
                if self.step == at:
                    _kill_self()
                return evaluate(trainer_self, *args, **kwargs)

            trainer.Trainer.evaluate = killing_evaluate
        elif where == "checkpoint":
            digests = checkpoint.file_digests

            def killing_digests(folder):
                if folder.name == f"step_{at}":
                    _kill_self()
                return digests(folder)

            checkpoint.file_digests = killing_digests

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.step = step
        if self.where == "step" and step == self.at:
            _kill_self()


class DiskFiller(_QuietLogger):
    """At step `at`, fills the file system of the run folder but `leave_bytes` (a ballast file): a disk
    that another job filled. With leave_bytes > 0 the journal's lines still fit and the next checkpoint
    does not; with 0, the journal's next line fails."""

    def __init__(self, run_dir: str, at: int = 3, leave_bytes: int = 0):
        from pathlib import Path

        self.ballast, self.at, self.leave_bytes = Path(run_dir) / "ballast", at, leave_bytes

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        import shutil

        if step != self.at or self.ballast.exists():  # evaluations log at the same step again
            return
        free = shutil.disk_usage(self.ballast.parent).free - self.leave_bytes
        chunk = b"\0" * 65536
        with self.ballast.open("wb") as handle:
            try:
                while free > 0:
                    free -= handle.write(chunk[: max(1, min(len(chunk), free))])
                    handle.flush()
            except OSError:
                pass


class ReadOnlyAfter(_QuietLogger):
    """At step `at`, makes the run folder read-only under the run (a read-only bind mount over it; root
    only): files opened from then on cannot be written, as on a disk the kernel remounted read-only."""

    def __init__(self, run_dir: str, at: int = 3):
        self.run_dir, self.at, self.done = run_dir, at, False

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        import subprocess

        if step == self.at and not self.done:  # evaluations log at the same step again
            self.done = True
            subprocess.run(["mount", "--bind", self.run_dir, self.run_dir], check=True)
            subprocess.run(["mount", "-o", "remount,ro,bind", self.run_dir], check=True)


class SlowStart(_QuietLogger):
    """Takes `seconds` to build (a slow tracker server, a cold file system), after writing `starting` into the run
    folder: a run stopped at this moment is stopped before its training loop answers signals."""

    def __init__(self, run_dir: str, seconds: float = 60.0):
        from pathlib import Path

        (Path(run_dir) / "starting").write_text("")
        time.sleep(seconds)
