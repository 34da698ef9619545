"""Components that fail on purpose, for tests of how a run ends. Configs reach them with build.allow=[tests] (as tests.faulty)."""

from __future__ import annotations

from collections.abc import Mapping

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
