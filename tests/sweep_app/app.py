"""The tasks of tests/sweep_app, a plain Hydra app (no curryTrain run): a quadratic, so the sweeper's best
value is known to be the smallest one; the same as a pair and as a list (two objectives); a task that fails
on a chosen n; and a custom_search_space function."""

from omegaconf import DictConfig
from optuna.trial import Trial


def quadratic(cfg: DictConfig) -> float:
    if cfg.get("fail_on") is not None and cfg.n == cfg.fail_on:
        raise RuntimeError(f"the task fails on n={cfg.n}")
    shift = cfg.n if cfg.op == "add" else cfg.n * 2
    return (cfg.x - 0.5) ** 2 + cfg.y**2 + shift


def two_objectives(cfg: DictConfig) -> tuple[float, float]:
    return quadratic(cfg), float(cfg.n)


def two_objectives_as_list(cfg: DictConfig) -> list[float]:
    return list(two_objectives(cfg))


def near_x(cfg: DictConfig, trial: Trial) -> None:
    """custom_search_space: y within cfg.spread of the x this trial drew, and a new key `+w` in [0, 1]."""
    x = trial.params["x"]
    trial.suggest_float("y", x - cfg.spread, x + cfg.spread)
    trial.suggest_float("+w", 0.0, 1.0)


TASKS = {"quadratic": quadratic, "two_objectives": two_objectives, "two_objectives_as_list": two_objectives_as_list}
