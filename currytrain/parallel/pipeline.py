"""The plan of pipeline parallelism (parallel.pp): which torch schedules are offered, how the layers are cut into
stages, which stages each pp rank runs, and what each schedule needs of the microbatches. Torch-free: validation
reads it. The stages themselves are built and run in currytrain/parallel/stages.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved_1f1b": "Interleaved1F1B",
    "looped_bfs": "LoopedBFS",
    "interleaved_zero_bubble": "InterleavedZeroBubble",
}
"""parallel.pp_schedule -> the name torch.distributed.pipelining.schedules.get_schedule_class knows. Not here: torch
2.13's V-shaped ZBVZeroBubble and DualPipeV, which train but whose eval() runs their backward actions and fails."""
ROUNDS = ("interleaved_1f1b", "interleaved_zero_bubble")
"""Schedules that run the microbatches in rounds of about pp each (torch requires equal rounds)."""
SINGLE_STAGE = ("gpipe", "1f1b")
"""Schedules that run one stage per rank; the others run two (virtual stages, looped: rank r holds r and r + pp)."""


def stages_per_rank(schedule: str) -> int:
    return 1 if schedule in SINGLE_STAGE else 2


def even_split(n_layers: int, num_stages: int) -> list[int]:
    """Layers per stage by layer count; the first stages take the remainder (the last one holds the readout)."""
    base, extra = divmod(n_layers, num_stages)
    return [base + (stage < extra) for stage in range(num_stages)]


def microbatch_problem(schedule: str, num_micro: int, pp: int) -> str | None:
    """What `schedule` needs of the number of microbatches (trainer.grad_accum) over pp ranks, as the fix; None when it fits."""
    if schedule == "gpipe":
        return None
    if num_micro < pp:
        return f"needs at least parallel.pp={pp} microbatches per step: pass trainer.grad_accum={pp} (or a multiple), or parallel.pp_schedule=gpipe"
    rounds = max(1, num_micro // pp)
    if schedule in ROUNDS and num_micro % rounds:
        return f"runs the microbatches in {rounds} equal rounds, which {num_micro} are not: pass trainer.grad_accum={num_micro // pp * pp}"
    return None


@dataclass(frozen=True)
class PipelinePlan:
    """Which stages exist, which layers each holds, and which stages each pp rank runs."""

    pp: int
    schedule: str
    split: tuple[int, ...]
    """Layers of each stage, in stage order."""

    @classmethod
    def of(cls, pp: int, schedule: str, split: Sequence[int] | None, n_layers: int) -> PipelinePlan:
        num_stages = pp * stages_per_rank(schedule)
        return cls(pp, schedule, tuple(split) if split else tuple(even_split(n_layers, num_stages)))

    @property
    def num_stages(self) -> int:
        return len(self.split)

    def stages_of(self, pp_rank: int) -> list[int]:
        """The stage indices pp rank `pp_rank` runs, in the order the schedule expects them."""
        if self.schedule in SINGLE_STAGE:
            return [pp_rank]
        return [pp_rank + loop * self.pp for loop in range(stages_per_rank(self.schedule))]

    def layers_of(self, stage: int) -> range:
        start = sum(self.split[:stage])
        return range(start, start + self.split[stage])

    def rank_of_last_stage(self) -> int:
        """The pp rank that computes the loss."""
        return next(rank for rank in range(self.pp) if self.num_stages - 1 in self.stages_of(rank))
