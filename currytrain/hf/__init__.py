"""The Hugging Face weight bridge: `currytrain hf import|export` (docs/hf.md).

Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, OLMo 2/3, Mixtral, Qwen3-MoE and DeepSeek-V3 checkpoints map
exactly onto curryTrain's GQA and MoE models (currytrain.hf.families); any config they cannot represent is
refused rather than converted approximately. transformers,
safetensors and huggingface_hub are optional (the `hf` extra) and imported only when used.
"""

from currytrain.hf.convert import export_hf, import_hf, load_model, read_model

__all__ = ["import_hf", "export_hf", "load_model", "read_model"]
