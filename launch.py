"""curryTrain's one Hydra app: a training run, a validation ladder or a sweep, by the selected config.

python launch.py                                   # debug GQA on the embedded corpus
python launch.py model/size=tiny optimizer.lr=1e-3 # overrides
python launch.py --cfg job                         # print the composed config
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from currytrain.config import register_configs

register_configs()

_task_started = False


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    global _task_started
    _task_started = True
    from currytrain.run import run  # torch and friends load only once a run really starts

    return run(cfg)


if __name__ == "__main__":
    try:
        main()
    except SystemExit as exit_:
        # Hydra exits 1 for composition errors (unknown option, mistyped key, bad type): those are
        # config errors, which curryTrain reports with exit code 2. Failures inside a run keep their code.
        if exit_.code == 1 and not _task_started:
            sys.exit(2)
        raise
