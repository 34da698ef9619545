"""The Hugging Face weight bridge: `currytrain hf import|export` (docs/hf.md).

Llama, Mistral, Qwen2, Qwen3 and Mixtral checkpoints map exactly onto curryTrain's GQA and MoE models; any
config they cannot represent is refused rather than converted approximately. transformers,
safetensors and huggingface_hub are optional (the `hf` extra) and imported only when used.
"""

from currytrain.hf.convert import export_hf, import_hf, load_model, read_model

__all__ = ["import_hf", "export_hf", "load_model", "read_model"]
