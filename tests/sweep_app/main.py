"""tests/sweep_app as a script, the way a user runs a plain Hydra app: python tests/sweep_app/main.py -m ..."""

import hydra
from app import TASKS
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg: DictConfig) -> object:
    return TASKS[cfg.task](cfg)


if __name__ == "__main__":
    main()
