"""Which model a folder of weights holds, read without torch: validation uses it before anything runs.

A weights folder is an import folder (`currytrain hf import`: model.yaml + model.safetensors), a run
folder (resolved.yaml + checkpoints/) or one checkpoint folder (<run>/checkpoints/step_N).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from omegaconf import OmegaConf

from currytrain.model.config import APPLIED_FROM_OUTSIDE

MODEL_YAML = "model.yaml"
RESOLVED = "resolved.yaml"


def model_node_of(path: str | Path) -> dict[str, Any] | None:
    """The model config node the weights at `path` were written with, or None if `path` is none of the three."""
    path = Path(path).expanduser()
    for candidate, key in ((path / MODEL_YAML, None), (path / RESOLVED, "model"), (path.parent.parent / RESOLVED, "model")):
        if candidate.is_file():
            node = OmegaConf.load(candidate)
            return OmegaConf.to_container(node[key] if key else node, resolve=True)
    return None


def architecture_mismatch(node: Mapping[str, Any], model_cfg: Mapping[str, Any]) -> str | None:
    """Why model_cfg cannot load weights written with `node` (the overrides that fix it), or None if it can."""
    if node.get("_target_") != model_cfg.get("_target_"):
        return f"holds a {node.get('_target_')}, the config builds {model_cfg.get('_target_')}: choose the matching model="
    fields = {key: value for key, value in node.items() if key not in APPLIED_FROM_OUTSIDE and key in model_cfg}
    mismatched = {key: value for key, value in fields.items() if model_cfg[key] != value}
    if not mismatched:
        return None
    return "holds a model the config does not describe: pass " + " ".join(f"model.{k}={v}" for k, v in mismatched.items())
