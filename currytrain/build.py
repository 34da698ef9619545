"""The one place that turns a config node into an object: build(cfg, **runtime)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from currytrain.errors import ConfigError

log = logging.getLogger(__name__)

ALLOWED_PREFIXES = ("currytrain.", "torch.", "experiments.")


def _targets(node: Any, path: str) -> Iterable[tuple[str, str]]:
    """Every (key, _target_) in the subtree: instantiate builds targets inside lists too."""
    if isinstance(node, DictConfig):
        target = node.get("_target_")
        if target is not None:
            yield path, str(target)
        for key in node.keys():
            yield from _targets(node._get_node(key), f"{path}.{key}" if path else str(key))
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            yield from _targets(node._get_node(index), f"{path}[{index}]")


def build(cfg: DictConfig, *, exclude: Iterable[str] = (), **runtime: Any) -> Any:
    """Instantiate `cfg._target_` with the config fields plus runtime-only arguments.

    exclude: config fields that are not constructor arguments (applied by someone else).
    Returns None for a node without a target (the `none` option of a group).
    """
    if cfg.get("_target_") is None:
        return None
    for path, target in _targets(cfg, ""):
        if not target.startswith(ALLOWED_PREFIXES):
            where = f"{path}._target_" if path else "_target_"
            raise ConfigError(f"{where}={target} is outside the allowed packages {list(ALLOWED_PREFIXES)}: move the class into experiments/")
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
