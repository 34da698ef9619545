"""The Llama-style GQA decoder. Architecture only: parallelism and checkpointing are applied from outside."""

from __future__ import annotations

from typing import Any

from currytrain.model.decoder import RopeDecoder
from currytrain.model.layers import Block, SwiGLU

__all__ = ["Block", "GQATransformer"]


class GQATransformer(RopeDecoder):
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab_size): a RopeDecoder whose blocks hold a
    gated MLP of width mlp_hidden (`mlp`, activation mlp_activation).

    fields: the other GQAConfig fields (RopeDecoder's keyword arguments): attention, norms, RoPE.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        n_layers: int,
        n_heads: int,
        n_kv_heads: int,
        mlp_hidden: int,
        max_seq_len: int,
        mlp_activation: str = "silu",
        **fields: Any,
    ):
        def build_mlp(_: int) -> tuple[str, SwiGLU]:
            return "mlp", SwiGLU(dim, mlp_hidden, mlp_activation)

        super().__init__(vocab_size, dim, n_layers, n_heads, n_kv_heads, max_seq_len, build_mlp=build_mlp, **fields)
