"""The second zoo: training bugs from the public record, each planted the way it happened in a model or data adapter
written in plain PyTorch, as a new user writes one (none of curryTrain's layers). The healthy control is a GPT in
the style of nanoGPT: learned position embeddings, dropout 0.1, blocks in `self.h`, the readout tied to the token
embedding, GPT-2's depth-scaled init of the residual projections, its own loss and its own parameter groups
(currytrain.model.protocol). A bug is one name in BUGS; each entry cites where it happened.

The bugs are planted in the model's or the adapter's own code, never in curryTrain: the ladder must find them from
the outside, through the model protocol.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from currytrain.data.corpus import TokenCorpus

IGNORE = -1
"""The ignore index of the control's own loss (nanoGPT's)."""


@dataclass(frozen=True)
class PublicBug:
    name: str
    """What went wrong, in a few words."""
    source: str
    """Where it happened: project and issue or pull request."""
    where: str
    """model or data: the part that carries it here."""
    probe: str
    """The ladder probe that names it, and the words its cause must hold (see tests/test_ladder_public_zoo.py)."""
    words: tuple[str, ...]
    stage: str = "preflight"
    """The cheapest stage that catches it."""


BUGS: dict[str, PublicBug] = {
    bug.name: bug
    for bug in (
        PublicBug(
            "shifted_twice",
            "huggingface/transformers #47394 (fix #47395): GitForCausalLM shifts the labels, then ForCausalLMLoss shifts them again; JetMoe the same (#37830)",
            "model",
            "loss scores the next token",
            ("shifted twice",),
        ),
        PublicBug(
            "not_shifted",
            "huggingface/transformers #27517: MBartForCausalLM scores each position against its own input token (the model learns to copy)",
            "model",
            "loss scores the next token",
            ("its own input",),
        ),
        PublicBug(
            "eos_masked_as_pad",
            "huggingface/trl #6357 (and meta-pytorch/torchtune #949): with pad = eos, every EOS target is set to -100, so the model never learns to stop",
            "data",
            "every token is scored",
            ("never scores",),
        ),
        PublicBug(
            "norms_decayed",
            "huggingface/transformers #35927: the no-decay filter matched nn.LayerNorm by type, so a hand-written RMSNorm's gains were decayed",
            "model",
            "weight decay",
            ("norm gains or biases",),
        ),
        PublicBug(
            "decay_by_name",
            'huggingface/transformers #42754 (fix #42769): no_decay = ["bias", "LayerNorm.weight"] misses norms named ln_1/ln_f',
            "model",
            "weight decay",
            ("norm gains or biases",),
        ),
        PublicBug(
            "eval_disables_dropout",
            "NVIDIA/Megatron-LM #411: FlashSelfAttention set self.dropout_p = 0 in an eval forward, so dropout stayed off for the rest of training",
            "model",
            "train mode after eval",
            ("eval pass changed",),
        ),
        PublicBug(
            "unscaled_residual_init",
            'huggingface/transformers #47458 (fix #47459): GPT-2\'s 1/sqrt(2 n_layer) init of c_proj matched name == "c_proj.weight" against full names and never ran',
            "model",
            "init scale with depth",
            ("depth",),
        ),
        PublicBug(
            "tied_by_copy",
            "NVIDIA/Megatron-LM #656: the LM head, a copy of the embedding kept equal by a sync, came untied during training (mosaicml/examples #11: never tied)",
            "model",
            "tied weights",
            ("drift apart",),
        ),
        PublicBug(
            "same_data_every_rank",
            "huggingface/datasets #5360 (and transformers #11254): an IterableDataset under DDP gave every process the same samples",
            "data",
            "distinct data per rank and microbatch",
            ("every rank",),
        ),
        PublicBug(
            "same_data_every_microbatch",
            "huggingface/datasets #3423: with num_workers > 1 every DataLoader worker streamed the same samples",
            "data",
            "distinct data per rank and microbatch",
            ("every microbatch",),
        ),
        PublicBug(
            "moe_aux_dropped",
            "huggingface/trl #6083: GRPO/RLOO dropped the MoE load-balancing loss the model computes, so nothing balances the routing",
            "model",
            "routing balance",
            ("no balancing term",),
        ),
        PublicBug(
            "moe_aux_double_softmax",
            "huggingface/transformers #45111: routers returned probabilities as router_logits and the balancing loss applied softmax again, flattening it",
            "model",
            "routing balance",
            ("barely responds",),
        ),
        PublicBug(
            "expert_bias_per_microbatch",
            "pytorch/torchtitan #1304: the auxiliary-loss-free expert bias was updated at every microbatch during gradient accumulation, not once per step",
            "model",
            "state across forwards",
            ("changes the model",),
        ),
        PublicBug(
            "rope_over_heads",
            "mlfoundations/open_lm #4: rotary embedding applied over the head dimension instead of the sequence dimension: no position information",
            "model",
            "probe copy",
            ("position",),
            stage="probe",
        ),
        PublicBug(
            "mask_sees_next",
            "huggingface/transformers #31673: Gemma 2's sliding-window mask let positions attend to later tokens (label leakage); #48745 the same in four CLM heads",
            "model",
            "causality",
            ("not causal",),
        ),
        PublicBug(
            "layerdrop_python_rng",
            "huggingface/transformers #17032 (and #11582): a resumed run did not restore the RNG its randomness drew from (here "
            "LayerDrop drawn from Python's random), so it diverged from the uninterrupted one",
            "model",
            "state across forwards",
            ("outside torch's RNG",),
        ),
        PublicBug(
            "init_flag_not_saved",
            "bayesiains/nflows #4 (fix #5): ActNorm's `initialized` flag was a plain attribute, so after loading a checkpoint the "
            "data-dependent init ran again and overwrote the trained scale and shift",
            "model",
            "resume equivalence",
            ("not the uninterrupted one",),
            stage="resume",
        ),
    )
}
"""Each bug, where it happened, and the probe that must name it."""


# ----------------------------------------------------------------------------------------------------- the model


class RMSNorm(nn.Module):
    """A hand-written RMSNorm (as Llama's reference code has): no nn.LayerNorm for a type check to find."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate x (batch, heads, seq, head_dim) by angles that grow with the position along dimension -2."""
    length, half = x.shape[-2], x.shape[-1] // 2
    freqs = 1.0 / theta ** (torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(length, device=x.device, dtype=torch.float32), freqs)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


class ActNorm(nn.Module):
    """Glow's activation normalisation: a per-channel shift and scale initialised from the statistics of the first
    training batch, then trained. flag: "attribute" keeps `initialized` as a plain attribute, which no state_dict holds
    (the bug); "buffer" registers it, so a checkpoint carries it (the fix)."""

    def __init__(self, dim: int, flag: str = "buffer"):
        super().__init__()
        self.shift, self.scale = nn.Parameter(torch.zeros(dim)), nn.Parameter(torch.ones(dim))
        self.flag = flag
        if flag == "buffer":
            self.register_buffer("initialized", torch.tensor(False))
        else:
            self.initialized = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not bool(self.initialized):
            with torch.no_grad():
                flat = x.reshape(-1, x.shape[-1])
                self.shift.copy_(-flat.mean(0))
                self.scale.copy_(1.0 / (flat.std(0) + 1e-6))
            if self.flag == "buffer":
                self.initialized.fill_(True)
            else:
                self.initialized = True
        return (x + self.shift) * self.scale


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, dropout: float, bug: str, positions: str):
        super().__init__()
        self.n_heads, self.bug, self.positions = n_heads, bug, positions
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.dropout_p = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads) for z in (q, k, v))
        if self.positions == "rope":
            if self.bug == "rope_over_heads":  # the bug: rotated in (batch, seq, heads, head_dim) layout, by head index
                q, k = rope(q), rope(k)
                q, k, v = (z.transpose(1, 2) for z in (q, k, v))
            else:
                q, k, v = (z.transpose(1, 2) for z in (q, k, v))
                q, k = rope(q), rope(k)
        else:
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.n_heads)
        above = 2 if self.bug == "mask_sees_next" else 1  # the bug: the diagonal above the main one stays visible
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(above), float("-inf"))
        if not self.training and self.bug == "eval_disables_dropout":
            self.dropout_p = 0.0  # the bug: the attribute, not a local, so dropout stays off after eval
        weights = F.dropout(scores.softmax(-1), self.dropout_p if self.training else 0.0, training=self.training)
        return self.resid_dropout(self.c_proj((weights @ v).transpose(1, 2).reshape(b, t, d)))


class MLP(nn.Module):
    def __init__(self, dim: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class MoE(nn.Module):
    """Top-2 of 4 experts, Switch/Mixtral style; its balancing loss is kept for the model's auxiliary_loss()."""

    def __init__(self, dim: int, bug: str, num_experts: int = 4, top_k: int = 2):
        super().__init__()
        self.num_experts, self.top_k, self.bug = num_experts, top_k, bug
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(dim, 0.0) for _ in range(num_experts))
        self.register_buffer("expert_bias", torch.zeros(num_experts))
        self.aux_loss = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits = self.gate(flat)
        probs = logits.softmax(-1)
        weights, chosen = (probs + self.expert_bias).topk(self.top_k, dim=-1)
        weights = probs.gather(-1, chosen)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for slot in range(self.top_k):
            for expert in range(self.num_experts):
                rows = chosen[:, slot] == expert
                if rows.any():
                    out[rows] += weights[rows, slot, None] * self.experts[expert](flat[rows])
        counts = F.one_hot(chosen, self.num_experts).sum((0, 1)).float()
        share = counts / counts.sum()
        balanced = probs.softmax(-1) if self.bug == "moe_aux_double_softmax" else probs  # the bug: a softmax of probabilities
        self.aux_loss = self.num_experts * (share * balanced.mean(0)).sum()
        if self.bug == "expert_bias_per_microbatch" and self.training:
            with torch.no_grad():  # the bug: the bias moves with every forward (every microbatch), not once per optimizer step
                self.expert_bias += 0.01 * torch.sign(share.mean() - share)
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int, dropout: float, bug: str, positions: str, moe: bool):
        super().__init__()
        norm = (lambda: RMSNorm(dim)) if bug == "norms_decayed" else (lambda: nn.LayerNorm(dim))
        self.ln_1, self.ln_2 = norm(), norm()
        self.attn = CausalSelfAttention(dim, n_heads, dropout, bug, positions)
        self.mlp = MoE(dim, bug) if moe else MLP(dim, dropout)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        if self.bug == "layerdrop_python_rng" and self.training and random.random() < 0.2:
            return x  # the bug: LayerDrop drawn from Python's RNG, which no checkpoint restores
        return x + self.mlp(self.ln_2(x))


MOE_BUGS = ("moe_aux_dropped", "moe_aux_double_softmax", "expert_bias_per_microbatch")
"""Bugs planted in the mixture-of-experts variant of the control."""


class GPT(nn.Module):
    """The healthy control (bug=""), or the control carrying one bug of BUGS. moe: top-2-of-4 expert MLPs, whose
    balancing loss the model offers as auxiliary_loss(). actnorm: "buffer" puts an ActNorm after the embeddings (its
    flag in the state_dict), "attribute" one whose flag is not (the bug init_flag_not_saved). positions: "learned"
    (nanoGPT's table) or "rope" (rotary, the bug rope_over_heads's)."""

    def __init__(
        self,
        vocab_size: int = 256,
        dim: int = 32,
        n_layers: int = 2,
        n_heads: int = 2,
        max_len: int = 64,
        dropout: float = 0.1,
        bug: str = "",
        moe: bool = False,
        actnorm: str = "",
        positions: str = "learned",
    ):
        super().__init__()
        assert not bug or bug in BUGS, f"unknown bug {bug}"
        actnorm = "attribute" if bug == "init_flag_not_saved" else actnorm
        self.bug, self.n_layers = bug, n_layers
        positions = "rope" if bug == "rope_over_heads" else positions
        moe = moe or bug in MOE_BUGS
        self.wte = nn.Embedding(vocab_size, dim)
        self.wpe = nn.Embedding(max_len, dim) if positions == "learned" else None
        self.drop = nn.Dropout(dropout)
        self.actnorm = ActNorm(dim, actnorm) if actnorm else None
        self.h = nn.ModuleList(Block(dim, n_heads, dropout, bug, positions, moe) for _ in range(n_layers))
        self.ln_f = RMSNorm(dim) if bug == "norms_decayed" else nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self.apply(self._init_weights)
        if bug == "tied_by_copy":  # the bug: two parameters that start equal, kept equal by nothing
            self.lm_head.weight = nn.Parameter(self.wte.weight.detach().clone())
        else:
            self.lm_head.weight = self.wte.weight
        self._scale_residual_init()

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def _scale_residual_init(self) -> None:
        """GPT-2's init of the projections that write into the residual stream: std 0.02 / sqrt(2 n_layer)."""
        std = 0.02 / math.sqrt(2 * self.n_layers)
        for name, param in self.named_parameters():
            # the bug: the full name (h.0.attn.c_proj.weight) is compared for equality, so nothing matches
            hit = name == "c_proj.weight" if self.bug == "unscaled_residual_init" else name.endswith("c_proj.weight")
            if hit:
                nn.init.normal_(param, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        x = self.drop(x)
        if self.actnorm is not None:
            x = self.actnorm(x)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def loss(self, logits: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Its own loss on (inputs, next-token targets) as (sum, scored targets); a target of IGNORE is not scored."""
        inputs, targets = batch
        if self.bug == "shifted_twice":  # the bug: the targets are already the next tokens, and are shifted once more
            logits, targets = logits[:, :-1], targets[:, 1:]
        if self.bug == "not_shifted":  # the bug: labels = input ids, scored without the shift
            targets = inputs
        targets = targets.reshape(-1)
        total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets, ignore_index=IGNORE, reduction="sum")
        return total, (targets != IGNORE).sum()

    def auxiliary_loss(self) -> torch.Tensor:
        """The experts' balancing losses of the last forward, weighted (nothing without experts)."""
        if self.bug == "moe_aux_dropped":  # the bug: the balancing loss it computed never reaches the training loss
            return torch.zeros((), device=self.wte.weight.device)
        losses = [block.mlp.aux_loss for block in self.h if isinstance(block.mlp, MoE)]
        return 0.01 * sum(losses) if losses else torch.zeros((), device=self.wte.weight.device)

    def param_groups(self):
        """nanoGPT's groups: every matrix (embeddings included) decayed, norm gains and biases not."""
        params = dict(self.named_parameters())
        if self.bug == "norms_decayed":  # the bug: norms found by type, and RMSNorm is no nn.LayerNorm
            norms = {id(p) for m in self.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
            decay = [p for n, p in params.items() if id(p) not in norms and not n.endswith("bias")]
        elif self.bug == "decay_by_name":  # the bug: the names of another codebase's norms
            no_decay = ("bias", "LayerNorm.weight")
            decay = [p for n, p in params.items() if not any(word in n for word in no_decay)]
        else:
            decay = [p for p in params.values() if p.dim() >= 2]
        chosen = {id(p) for p in decay}
        return [{"params": decay, "weight_decay": 0.1}, {"params": [p for p in params.values() if id(p) not in chosen], "weight_decay": 0.0}]


# ---------------------------------------------------------------------------------------------------- the data


EOS = 0
"""The end-of-document id of DocumentCorpus (and, with pad = eos, its pad id)."""


class DocumentCorpus(TokenCorpus):
    """Documents of 8-40 tokens, each ended by EOS, packed into the stream (a pretraining corpus with document
    boundaries). bug="eos_masked_as_pad": the pad id is the EOS id, and targets equal to the pad id are set to
    IGNORE (every EOS target), as a collator that masks padding by its id does."""

    def __init__(self, train: torch.Tensor, val: torch.Tensor, seq_len: int, seed: int, bug: str = ""):
        generator = torch.Generator().manual_seed(seed)
        super().__init__(self._documents(train, generator), self._documents(val, generator), seq_len, seed)
        self.vocab_size = 256
        self.ignore_index = IGNORE  # the targets it masks (none, but for the bug) carry the control's own ignore index
        self.bug = bug

    @staticmethod
    def _documents(stream: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        stream = stream.clone()
        stream[stream == EOS] = 1  # EOS marks boundaries only
        ends = torch.cumsum(torch.randint(8, 41, (len(stream) // 8,), generator=generator), 0)
        stream[ends[ends < len(stream)]] = EOS
        return stream

    def batch(self, split, step, micro, batch_size, rank=0, num_ranks=1):
        if self.bug == "same_data_every_rank":  # the bug: every rank draws the whole global batch's first share
            rank = 0
        if self.bug == "same_data_every_microbatch":  # the bug: every worker (microbatch) streams the same samples
            micro = 0
        inputs, targets = super().batch(split, step, micro, batch_size, rank, num_ranks)
        if self.bug == "eos_masked_as_pad":
            targets = targets.masked_fill(targets == EOS, IGNORE)
        return inputs, targets


def documents(data: TokenCorpus, bug: str = "") -> DocumentCorpus:
    """The streams of `data` (a TokenCorpus) cut into EOS-ended documents."""
    return DocumentCorpus(data.train, data.val, data.seq_len, data.seed, bug if bug in DATA_BUGS else "")


DATA_BUGS = tuple(name for name, bug in BUGS.items() if bug.where == "data")


def build(bug: str = "", **sizes) -> tuple[GPT, str]:
    """The control carrying `bug` (a data bug leaves the model healthy), and the data bug to plant ("" for none)."""
    model_bug = bug if bug and BUGS[bug].where == "model" else ""
    layers = 12 if bug == "unscaled_residual_init" else sizes.pop("n_layers", 2)  # GPT-2 small's depth, where the bug happened
    return GPT(bug=model_bug, n_layers=layers, **sizes), bug if bug in DATA_BUGS else ""
