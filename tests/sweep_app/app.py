"""The task of tests/sweep_app: a quadratic, so the sweeper's best value is known to be the smallest one."""

from omegaconf import DictConfig


def quadratic(cfg: DictConfig) -> float:
    shift = cfg.n if cfg.op == "add" else cfg.n * 2
    return (cfg.x - 0.5) ** 2 + shift


def two_objectives(cfg: DictConfig) -> tuple[float, float]:
    return quadratic(cfg), float(cfg.n)
