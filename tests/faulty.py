"""Components that fail on purpose, for tests of how a run ends. Configs reach them with build.allow=[tests] (as tests.faulty)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from currytrain.data.corpus import StdlibBytes
from currytrain.model.gqa import GQATransformer


class CrashingLogger:
    """A logger whose log_metrics raises at step `fail_at`: a crash in the middle of training."""

    closed: list[str] = []

    def __init__(self, run_dir: str, fail_at: int = 3):
        self.run_dir, self.fail_at = run_dir, fail_at

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if step >= self.fail_at:
            raise RuntimeError(f"logger exploded at step {step}")

    def log_config(self, config: Mapping) -> None:
        pass

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        pass

    def log_histogram(self, name, values, step: int) -> None:
        pass

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


class SlowLogger:
    """A logger that sleeps `seconds` per log_metrics call: a run slow enough to be interrupted on cue."""

    def __init__(self, run_dir: str, seconds: float = 0.1):
        self.seconds = seconds

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        import time

        time.sleep(self.seconds)

    def log_config(self, config: Mapping) -> None:
        pass

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        pass

    def log_histogram(self, name, values, step: int) -> None:
        pass

    def close(self, status: str = "finished") -> None:
        pass


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
