"""Benchmarking entry points: one optimizer step (forward + backward + step over N microbatches)."""

from currytrain.trainer.step import StepResult, causal_lm_loss, run_accumulated_step

__all__ = ["run_accumulated_step", "StepResult", "causal_lm_loss"]
