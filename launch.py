"""curryTrain's one Hydra app: a training run, a validation ladder or a sweep, by the selected config.

    python launch.py                                   # debug GQA on the embedded corpus
    python launch.py model/size=tiny optimizer.lr=1e-3 # overrides
    python launch.py --cfg job                         # print the composed config
    python launch.py parallel=fsdp parallel.nproc=2    # starts 2 workers itself
    torchrun --nproc_per_node 2 launch.py parallel=ddp # rank 0 composes; the others read its run folder

Jobs raise typed outcomes (currytrain.errors); currytrain.app turns them into exit codes:
0 ok, 1 crash or failed run, 2 config error, 3 failed ladder gate, 4 abort.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from currytrain.app import run_app, run_task
from currytrain.build import hydra_main_whitelist
from currytrain.config import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config", **hydra_main_whitelist())  # Hydra 1.4: its own guard too
def main(cfg: DictConfig) -> float | None:
    return run_task(cfg)


if __name__ == "__main__":
    run_app(main)
