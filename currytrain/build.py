"""The one place that turns a config node into an object: build(cfg, **runtime).

Only targets that live in an allowed module are built: curryTrain itself, the project's experiments/, and
the torch modules configs need (torch.optim), and Optuna's samplers and pruners (sweep configs). A target is resolved before it is allowed, so a name that
re-exports something from elsewhere (`torch.os.system`, `currytrain.run.os.system`) is refused by where the
object really lives. A project adds modules with `build.allow=[my_package]` in its config.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from currytrain.errors import ConfigError

log = logging.getLogger(__name__)

# optuna.samplers and optuna.pruners are allowed on purpose, and nothing else of optuna: sweep configs name a
# sampler and a pruner by their class (as hydra-optuna-sweeper configs do), and both are plain search algorithms.
ALLOWED_MODULES = ("currytrain", "experiments", "torch.optim", "optuna.samplers", "optuna.pruners")
_extra_allowed: tuple[str, ...] = ()


def allow_modules(modules: Iterable[str]) -> None:
    """The config's `build.allow` modules, for every later build() in this process (build_components sets
    them for the run it builds; they replace those of an earlier run in the same process)."""
    global _extra_allowed
    _extra_allowed = tuple(modules)


def _inside(module: str, allowed: Iterable[str]) -> bool:
    return any(module == root or module.startswith(root + ".") for root in allowed)


def target_problem(target: str, extra: Iterable[str] = ()) -> str | None:
    """Why `target` may not be built (outside the allowed modules, or not importable), or None if it may."""
    allowed = (*ALLOWED_MODULES, *extra)
    module, _, _ = target.rpartition(".")
    fix = "move the class into experiments/ (or add its package to build.allow)"
    if not module or not _inside(module, allowed):
        return f"{target} is outside the allowed modules {list(allowed)}: {fix}"
    from hydra.utils import get_object  # Hydra's own resolver, the one instantiate() uses

    try:
        found = get_object(target)
    except Exception as error:  # any import failure is the user's to fix
        reason = " ".join(str(error.__cause__ or error).split())
        return f"{target} cannot be imported ({reason}): check the spelling, or that the module imports"
    home = getattr(found, "__module__", None)
    if not callable(found) or home is None or not _inside(home, allowed):
        return f"{target} resolves to {found!r} from module {home}, outside the allowed modules {list(allowed)}: {fix}"
    return None


def targets(node: Any, path: str = "") -> Iterable[tuple[str, str]]:
    """Every (key, _target_) in the subtree: instantiate builds targets inside lists too."""
    if isinstance(node, DictConfig):
        target = node.get("_target_")
        if target is not None:
            yield (f"{path}._target_" if path else "_target_"), str(target)
        for key in node.keys():
            yield from targets(node._get_node(key), f"{path}.{key}" if path else str(key))
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            yield from targets(node._get_node(index), f"{path}[{index}]")


def target_problems(node: Any, path: str = "", extra: Iterable[str] = ()) -> list[str]:
    return [f"{key}={problem}" for key, target in targets(node, path) if (problem := target_problem(target, extra))]


def build(cfg: DictConfig, *, exclude: Iterable[str] = (), **runtime: Any) -> Any:
    """Instantiate `cfg._target_` with the config fields plus runtime-only arguments.

    exclude: config fields that are not constructor arguments (applied by someone else).
    Returns None for a node without a target (the `none` option of a group).
    """
    if cfg.get("_target_") is None:
        return None
    problems = target_problems(cfg, extra=_extra_allowed)
    if problems:
        raise ConfigError("; ".join(problems))
    collisions = sorted(set(runtime) & set(cfg.keys()))
    if collisions:
        raise ConfigError(f"build({cfg._target_}): runtime arguments {collisions} collide with config fields of the same name")
    node = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k not in set(exclude)]) if exclude else cfg
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate  # deferred: keeps `import currytrain.build` cheap

    log.debug("build %s", cfg._target_)
    try:
        return instantiate(node, _convert_="all", **runtime)
    except InstantiationException as error:
        # A component's own ConfigError is the user's message: pass it on unwrapped.
        if isinstance(error.__cause__, ConfigError):
            raise error.__cause__ from None
        raise
