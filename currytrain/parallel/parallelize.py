"""parallelize_decoder: everything applied to a built decoder from outside its model file.

Every decoder family (gqa, moe, spiking) keeps its blocks in `model.layers`, an nn.ModuleList, so the three
share this one function, which applies the parallelisms in a fixed order.
"""

from __future__ import annotations

import functools
import logging

import torch
from omegaconf import DictConfig
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import create_selective_checkpoint_contexts

from currytrain.model.config import AC_MODES, AC_POLICIES
from currytrain.parallel.compile import apply_compile
from currytrain.parallel.pipeline import PipelinePlan
from currytrain.parallel.state import ParallelState

log = logging.getLogger(__name__)

aten = torch.ops.aten

# What ac_policy=op keeps: matrix products (every linear layer lowers to one of these) and the fused
# attention kernels. They hold most of a block's FLOPs; the norms, RoPE and activations between them
# are cheap to recompute and hold many of its saved bytes.
MATMUL_OPS = [
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
]


def parallelize_decoder(
    model: nn.Module,
    state: ParallelState,
    model_cfg: DictConfig,
    zero_stage: int = 0,
    param_dtype: torch.dtype | None = None,
    compile: bool = False,
    pipeline: PipelinePlan | None = None,
) -> nn.Module:
    """Apply parallelism to a decoder whose blocks are `model.layers`, in place; returns the model.

    state: which axes this job has (tensor/data parallel groups come from its mesh).
    model_cfg: the model sub-tree; its APPLIED_FROM_OUTSIDE fields (ac, ac_policy, ac_every) are read here.
    zero_stage: 2 or 3 shard the parameters with FSDP2 over the data-parallel axes (0 and 1 leave them whole).
    param_dtype: FSDP2 gathers the parameters in this dtype for compute (bf16 runs) and reduces gradients in
    fp32; None gathers them as stored (fp32).
    compile (trainer.compile): torch.compile each block.
    pipeline: the stages under pipeline parallelism; this rank keeps the parts of its own stages only.
    """
    # 1. Tensor parallelism: shards each block's projections over the mesh's tp axis; first, so that every later
    #    wrapper (checkpointing, FSDP) sees DTensor parameters already laid out on it.
    if state.dims is not None and state.dims.tp > 1:
        apply_tp(model, state.views["tp"])
    # 2. Context parallelism: ring attention over the cp ranks' sequence shards, RoPE at their global positions.
    if state.dims is not None and state.dims.cp > 1:
        from currytrain.parallel.context import apply_cp

        apply_cp(model, state.views["cp"])
    # 3. Expert parallelism (model=moe): each ep rank keeps its share of the experts; tokens travel to them.
    if state.dims is not None and state.dims.ep > 1:
        apply_ep(model, state)
    # 4. Pipeline split: this pp rank keeps its stages' blocks (under their whole-model names), the embedding if it
    #    runs the first stage, the readout if the last; after TP/CP/EP (which shard what remains), before AC, compile
    #    and FSDP, which then wrap only the kept blocks.
    if pipeline is not None:
        from currytrain.parallel.stages import apply_pp_split  # torch's pipelining: imported only when used

        apply_pp_split(model, pipeline, state.views["pp"].get_local_rank())
    # 5. Activation checkpointing: after TP so that recomputation replays the sharded ops; before compile
    #    and FSDP so that both see the checkpoint wrappers as the blocks.
    apply_ac(model, model_cfg.ac, model_cfg.ac_policy, model_cfg.ac_every)
    # 6. torch.compile per block: after AC so that the compiled graph holds the checkpointed block (its
    #    recomputation included); before FSDP so that FSDP's gathers and hooks stay outside the graph.
    if compile:
        apply_compile(model)
    # 7. FSDP: fully_shard per block, then the root.
    if zero_stage >= 2 and state.mesh is not None:
        apply_fsdp(model, state, reshard_after_forward=zero_stage == 3, param_dtype=param_dtype)
    return model


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Tensor + sequence parallelism (Megatron-style) on a GQA or MoE decoder, in place, over the 1-D `tp_mesh`.

    Between blocks the residual stream stays split over the sequence (Shard(1)): the norms run on their share
    of positions (SequenceParallel). Attention and the MLP gather the sequence, compute their share of the heads /
    hidden units (ColwiseParallel: wq wk wv w1 w3), and the row-parallel output projections (wo w2) reduce-scatter
    back onto the sequence. The readout is column-parallel over the vocabulary and stays sharded: the loss is
    computed on the shards inside loss_parallel (ParallelState.loss_context), never gathering the full logits.

    model=moe: attention, norms, embedding and readout as above; each MoE layer (router, experts, shared expert) is
    replicated over the tp ranks. It takes the whole sequence as a plain tensor (gathered), so every tp rank routes
    the same tokens to the same experts and gets the same output, of which it keeps its positions (Shard(1), a local
    slice). In backward the output gradient is gathered whole, so every rank's MoE gradients are the same and need no
    all-reduce; the expert compute is repeated on each tp rank (the price of not splitting the experts).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleInputOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from currytrain.model.gqa import GQATransformer
    from currytrain.model.moe import MoE, MoETransformer

    if not isinstance(model, GQATransformer | MoETransformer):  # validation refuses other families first
        raise TypeError(f"parallel.tp has a plan for the GQA and MoE decoders only, not {type(model).__name__}")
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        },
    )
    gather_sequence = PrepareModuleInput(input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None))
    for block in model.layers:
        plan = {
            "attention_norm": SequenceParallel(),
            "attention": gather_sequence,
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "mlp_norm": SequenceParallel(),
        }
        if isinstance(getattr(block, "moe", None), MoE):  # model=moe's dense_layers keep the dense plan below
            plan["moe"] = PrepareModuleInputOutput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                use_local_input=True,
                output_layouts=(Replicate(),),
                desired_output_layouts=(Shard(1),),
                use_local_output=True,  # the residual stream between the sublayers is local, as wo's and w2's outputs are
            )
        else:
            plan |= {
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp.w1": ColwiseParallel(),
                "mlp.w3": ColwiseParallel(),
                "mlp.w2": RowwiseParallel(output_layouts=Shard(1)),
            }
        parallelize_module(block, tp_mesh, plan)
    log.info("tensor parallel: %d blocks over tp=%d (sequence parallel norms, loss parallel readout)", len(model.layers), tp_mesh.size())


def apply_ep(model: nn.Module, state: ParallelState) -> None:
    """Expert parallelism on every MoE layer, in place: its experts become ExpertParallelExperts over the ep axis,
    and its balance statistics count the tokens of every data-parallel rank (currytrain/parallel/expert.py)."""
    from currytrain.model.moe import MoE
    from currytrain.parallel.expert import ExpertParallelExperts, sum_counts

    layers = [module for module in model.modules() if isinstance(module, MoE)]
    if not layers:  # validation refuses other families first
        raise TypeError(f"parallel.ep shards the experts of model=moe; {type(model).__name__} has no MoE layer")
    for moe in layers:
        moe.experts = ExpertParallelExperts(moe.experts, state.views["ep"], state.views["ep_replicate"], state.dp_size)
        moe.reduce_counts = sum_counts(state.view("batch").get_group())
    log.info("expert parallel: %d MoE layers, %d of %d experts per rank", len(layers), layers[0].experts.num_local, layers[0].num_experts)


def apply_fsdp(model: nn.Module, state: ParallelState, reshard_after_forward: bool, param_dtype: torch.dtype | None = None) -> None:
    """FSDP2 fully_shard on every block of `model.layers`, then on the root (embedding, final norm, output).

    Sharded over dp_shard; with dp_replicate > 1 the 2-D mesh makes it HSDP (replicated across groups).
    reshard_after_forward=False keeps each block's parameters gathered from its forward to its backward:
    ZeRO-2 (only gradients and optimizer state stay sharded), one all-gather per step instead of two.
    param_dtype (bf16 runs): the all-gathers move bf16 (half the bytes) and the blocks compute in it; the
    sharded fp32 parameters and the optimizer stay fp32, and gradients are reduced in fp32.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = state.view("shard")
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype is not None else None)
    for block in model.layers:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # The root's own group (embedding, norm, output) is used last in backward: no point resharding it.
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)
    log.info(
        "fully_shard: %d blocks + root over %s (reshard_after_forward=%s, param_dtype=%s)",
        len(model.layers),
        tuple(mesh.shape),
        reshard_after_forward,
        param_dtype,
    )


def apply_ac(model: nn.Module, mode: str, policy: str = "block", every: int = 1) -> None:
    """Wrap the blocks of `model.layers` in torch's non-reentrant activation checkpointing, in place.

    mode: none | full | selective. full recomputes every block in backward, keeping only its input.
    policy (selective only): block recomputes every `every`-th block (blocks 0, every, 2*every, ...)
    whole; op recomputes, in every block, all but the outputs of MATMUL_OPS.
    Gradients are unchanged: only what is kept for backward, and so what is recomputed, differs.
    """
    if mode not in AC_MODES:
        raise ValueError(f"model.ac={mode} is not one of {list(AC_MODES)}")
    if mode == "none":
        return
    if policy not in AC_POLICIES:
        raise ValueError(f"model.ac_policy={policy} is not one of {list(AC_POLICIES)}")
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"activation checkpointing wraps model.layers, an nn.ModuleList of blocks; {type(model).__name__} has none")
    if mode == "selective" and policy == "op":
        context_fn = functools.partial(create_selective_checkpoint_contexts, MATMUL_OPS)
        wrap = functools.partial(checkpoint_wrapper, context_fn=context_fn)
        chosen = range(len(layers))
    else:
        wrap = checkpoint_wrapper
        chosen = range(0, len(layers), every if mode == "selective" else 1)
    for index in chosen:
        # The wrapper strips its own prefix from state_dict keys (DCP's too), so checkpoints load across ac
        # modes; it forwards attribute access, so model.layers[i].attention still works.
        layers[index] = wrap(layers[index])
    log.info("activation checkpointing: ac=%s%s on %d of %d blocks", mode, f" ({policy})" if mode == "selective" else "", len(chosen), len(layers))
