"""ParallelState: who this process is in the job. The one object that answers rank and group questions.

Later parallelisms add a DeviceMesh with named axes (pp, dp_replicate, dp_shard, cp, tp, ep); code
asks this object for ranks and groups and never calls dist.new_group itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ParallelState:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    mesh: object | None = None
    """torch DeviceMesh when the job has more than one axis; None for a single process."""

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run folder's shared files (journal, logs, resolved config)."""
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        return self.rank if self.mesh is None else self.mesh.get_local_rank("dp")

    @property
    def dp_size(self) -> int:
        return self.world_size if self.mesh is None else self.mesh.size("dp")


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """trainer.device: auto picks the GPU of this local rank when CUDA is present, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(name)
