"""The fine-tune experiment an import writes: the imported model, its weights, its tokenizer, a short context.

`currytrain hf import` puts it at <import>/experiment/finetune.yaml, an ordinary `# @package _global_`
experiment file that Hydra finds when the import folder is on its search path:

    python launch.py hydra.searchpath=[file://<import>] experiment=finetune data.paths=[my_text/]

The model keeps every field of the import except max_seq_len, which only sizes the RoPE tables: a
checkpoint's max_position_embeddings (32k-1M) would make every step a 32k-1M token batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from currytrain.model.config import GQAConfig, MoEConfig

FINETUNE_SEQ_LEN = 512
"""Tokens per sequence of the written experiment (at most the checkpoint's own context)."""
EXPERIMENT = Path("experiment") / "finetune.yaml"
MODEL_OPTIONS = {GQAConfig._target_: "gqa", MoEConfig._target_: "moe"}
"""The model group option that builds each imported class (the experiment names the option, not the class)."""


def finetune_experiment(node: dict[str, Any], folder: Path, source: str) -> str:
    """The YAML text of the fine-tune experiment for an import folder (absolute paths, so it runs from anywhere)."""
    folder = folder.resolve()
    model = {key: value for key, value in node.items() if key != "_target_"}
    model["max_seq_len"] = min(int(node["max_seq_len"]), FINETUNE_SEQ_LEN)
    tokenizer = str(folder) if (folder / "hf" / "tokenizer.json").is_file() else "???"
    body = {
        "defaults": [{"override /model": MODEL_OPTIONS[node["_target_"]]}, {"override /data": "tokens"}],
        "model": model,
        "data": {"tokenizer": tokenizer},
        "trainer": {"init_from": str(folder), "batch_size": 8, "max_steps": 200, "eval_every": 50, "checkpoint_every": 0},
        "optimizer": {"lr": 3.0e-5, "weight_decay": 0.0, "schedule": {"warmup_steps": 20}},
    }
    header = (
        "# @package _global_\n"
        f"# Fine-tune {source} from its imported weights on your text, with its own tokenizer (written by currytrain hf import):\n"
        f"#   {finetune_command(folder)}\n"
        f"# model.max_seq_len is {model['max_seq_len']} (the checkpoint's context is {node['max_seq_len']}): it only sizes the RoPE tables.\n"
    )
    if tokenizer == "???":
        header += "# The import has no hf/tokenizer.json: pass data.tokenizer=<a tokenizer.json or folder>.\n"
    return header + OmegaConf.to_yaml(OmegaConf.create(body))


def finetune_command(folder: Path) -> str:
    """The launch.py command line that runs the experiment of an import folder."""
    return f"python launch.py hydra.searchpath=[file://{folder.resolve()}] experiment=finetune data.paths=[YOUR_TEXT]"


def write_finetune_experiment(stage: Path, node: dict[str, Any], final: Path, source: str) -> None:
    """Write <stage>/experiment/finetune.yaml, with the paths the folder will have once renamed to `final`."""
    (stage / EXPERIMENT.parent).mkdir()
    text = finetune_experiment(node, stage, source).replace(str(stage.resolve()), str(final.resolve()))
    (stage / EXPERIMENT).write_text(text)
