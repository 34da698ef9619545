"""The spiking decoder: LIF neurons over T timesteps, surrogate-gradient spikes, spiking self-attention.

Architecture only: parallelism and checkpointing are applied from outside.

Shapes carry a leading timestep axis: (T, batch, seq, dim). Each token's embedding is presented as a
constant input current for T steps; every linear layer reads binary spikes; the residual stream is
real-valued (a membrane shortcut) and is averaged over T before the output head.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from currytrain.model.config import SPIKE_RESETS, SPIKE_SURROGATES
from currytrain.model.decoder import Decoder
from currytrain.model.layers import RMSNorm

# --- Surrogate derivatives -------------------------------------------------------------------------
# Each maps x = membrane - threshold and the slope alpha to d(spike)/dx used in backward. All three
# integrate to 1 over x, so they approximate the Dirac delta that is the true derivative of the step.


def _sigmoid_derivative(x: torch.Tensor, slope: float) -> torch.Tensor:
    """Derivative of sigmoid(alpha x): alpha sigma (1 - sigma)."""
    sig = torch.sigmoid(slope * x)
    return slope * sig * (1 - sig)


def _atan_derivative(x: torch.Tensor, slope: float) -> torch.Tensor:
    """Derivative of 1/2 + atan(pi/2 alpha x) / pi."""
    return (slope / 2) / (1 + (math.pi / 2 * slope * x).square())


def _triangle_derivative(x: torch.Tensor, slope: float) -> torch.Tensor:
    """A triangle of height alpha and half-width 1/alpha centred on the threshold."""
    return slope * (1 - slope * x.abs()).clamp_min(0)


SURROGATE_DERIVATIVES = {
    "sigmoid": _sigmoid_derivative,
    "atan": _atan_derivative,
    "triangle": _triangle_derivative,
}
assert tuple(SURROGATE_DERIVATIVES) == SPIKE_SURROGATES, "config.SPIKE_SURROGATES and the table above disagree"


class SpikeFunction(torch.autograd.Function):
    """Heaviside step forward (1 where x >= 0, else 0); the chosen surrogate's derivative backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, surrogate: str, slope: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.surrogate, ctx.slope = surrogate, slope
        return (x >= 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (x,) = ctx.saved_tensors
        # Evaluated in at least fp32 so bf16 activations keep the surrogate's tails.
        dtype = torch.promote_types(x.dtype, torch.float32)
        derivative = SURROGATE_DERIVATIVES[ctx.surrogate](x.to(dtype), ctx.slope)
        return (grad_output.to(dtype) * derivative).to(grad_output.dtype), None, None


def spike(x: torch.Tensor, surrogate: str = "sigmoid", slope: float = 4.0) -> torch.Tensor:
    """Spikes (exactly 0. or 1.) of x = membrane - threshold, differentiable through the surrogate."""
    return SpikeFunction.apply(x, surrogate, slope)


# --- LIF neuron --------------------------------------------------------------------------------------


def lif_scan(
    current: torch.Tensor,
    *,
    tau: float,
    threshold: float,
    reset: str,
    surrogate: str,
    slope: float,
    detach_reset: bool = True,
    return_membrane: bool = False,
):
    """Run LIF neurons over the leading timestep axis of `current` (T, ...), starting at rest (0).

    Per step t, with decay = 1 - 1/tau:
        charge   h[t] = decay * v[t-1] + current[t]
        fire     s[t] = 1 if h[t] >= threshold else 0
        reset    v[t] = h[t] - threshold * s[t]        (soft)
                 v[t] = h[t] * (1 - s[t])              (hard: back to 0)
    Returns the spikes shaped like `current`, or (spikes, membrane) with return_membrane, where
    membrane holds v[t], after the reset.
    """
    decay = 1.0 - 1.0 / tau
    potential = torch.zeros_like(current[0])
    spikes, membrane = [], []
    for step_current in current.unbind(0):
        charged = torch.add(step_current, potential, alpha=decay)
        fired = spike(charged - threshold, surrogate, slope)
        resetting = fired.detach() if detach_reset else fired
        potential = charged.sub(resetting, alpha=threshold) if reset == "soft" else charged * (1 - resetting)
        spikes.append(fired)
        if return_membrane:
            membrane.append(potential)
    if return_membrane:
        return torch.stack(spikes), torch.stack(membrane)
    return torch.stack(spikes)


class LIF(nn.Module):
    """A layer of LIF neurons: input current (T, ...) -> spikes (T, ...). Stateless across calls.

    Keeps the firing rate of its last forward pass (a detached scalar tensor, read without a device sync).
    """

    def __init__(self, tau: float, threshold: float, reset: str, surrogate: str, slope: float, detach_reset: bool = True):
        super().__init__()
        if reset not in SPIKE_RESETS:
            raise ValueError(f"reset={reset!r} is not one of {list(SPIKE_RESETS)}")
        if surrogate not in SURROGATE_DERIVATIVES:
            raise ValueError(f"surrogate={surrogate!r} is not one of {list(SURROGATE_DERIVATIVES)}")
        if tau < 1 or threshold <= 0 or slope <= 0:
            raise ValueError(f"need tau >= 1, threshold > 0, slope > 0; got tau={tau}, threshold={threshold}, slope={slope}")
        self.tau, self.threshold, self.reset, self.detach_reset = tau, threshold, reset, detach_reset
        self.surrogate, self.slope = surrogate, slope
        self.last_rate: torch.Tensor | None = None

    def forward(self, current: torch.Tensor) -> torch.Tensor:
        spikes = lif_scan(
            current,
            tau=self.tau,
            threshold=self.threshold,
            reset=self.reset,
            surrogate=self.surrogate,
            slope=self.slope,
            detach_reset=self.detach_reset,
        )
        self.last_rate = spikes.detach().float().mean()
        return spikes

    def extra_repr(self) -> str:
        return f"tau={self.tau}, threshold={self.threshold}, reset={self.reset}, surrogate={self.surrogate}({self.slope})"


# --- Spiking transformer -----------------------------------------------------------------------------


class SpikingProjection(nn.Module):
    """Spikes in, spikes out: LIF(RMSNorm(W s)). The per-token RMSNorm stands in for Spikformer's
    BatchNorm, which would mix statistics across positions and leak future tokens into a causal LM."""

    def __init__(self, in_dim: int, out_dim: int, norm_eps: float, neuron: dict):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim, bias=False)
        self.norm = RMSNorm(out_dim, norm_eps)
        self.lif = LIF(**neuron)

    def forward(self, spikes: torch.Tensor) -> torch.Tensor:
        return self.lif(self.norm(self.linear(spikes)))


class SpikingSelfAttention(nn.Module):
    """Causal spiking self-attention: binary Q, K, V; scores Q K^T without softmax, masked to the past.

    For query position i the output is the mean over visible keys j <= i of (q_i . k_j) v_j, divided by
    head_dim, so it lies in [0, 1] whatever the position; an RMSNorm and an LIF turn it back into spikes
    before the output projection.
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, norm_eps: float, neuron: dict):
        super().__init__()
        assert dim % n_heads == 0 and n_heads % n_kv_heads == 0
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = dim // n_heads
        self.q = SpikingProjection(dim, n_heads * self.head_dim, norm_eps, neuron)
        self.k = SpikingProjection(dim, n_kv_heads * self.head_dim, norm_eps, neuron)
        self.v = SpikingProjection(dim, n_kv_heads * self.head_dim, norm_eps, neuron)
        self.attn_norm = RMSNorm(n_heads * self.head_dim, norm_eps)
        self.attn_lif = LIF(**neuron)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def _heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        steps, batch, seq_len, _ = x.shape
        return x.view(steps, batch, seq_len, n_heads, self.head_dim).transpose(2, 3)

    def forward(self, spikes: torch.Tensor) -> torch.Tensor:
        steps, batch, seq_len, _ = spikes.shape
        q = self._heads(self.q(spikes), self.n_heads)
        k = self._heads(self.k(spikes), self.n_kv_heads)
        v = self._heads(self.v(spikes), self.n_kv_heads)
        if self.n_kv_heads != self.n_heads:
            groups = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(groups, dim=2)
            v = v.repeat_interleave(groups, dim=2)
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=spikes.device).tril()
        scores = (q @ k.transpose(-2, -1)).masked_fill(~causal, 0)
        visible = torch.arange(1, seq_len + 1, device=spikes.device, dtype=scores.dtype).unsqueeze(-1)
        out = (scores @ v) / (visible * self.head_dim)
        out = out.transpose(2, 3).reshape(steps, batch, seq_len, -1)
        return self.wo(self.attn_lif(self.attn_norm(out)))


class SpikingMLP(nn.Module):
    """Spikes -> LIF(RMSNorm(w1 s)) -> w2; the hidden layer is a spike train."""

    def __init__(self, dim: int, hidden_dim: int, norm_eps: float, neuron: dict):
        super().__init__()
        self.hidden = SpikingProjection(dim, hidden_dim, norm_eps, neuron)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, spikes: torch.Tensor) -> torch.Tensor:
        return self.w2(self.hidden(spikes))


class SpikingBlock(nn.Module):
    """x + attn(LIF(norm(x))), then x + mlp(LIF(norm(x))): the residual stream is real, the sublayers spike."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, mlp_hidden: int, norm_eps: float, neuron: dict):
        super().__init__()
        self.attention_norm = RMSNorm(dim, norm_eps)
        self.attention_lif = LIF(**neuron)
        self.attention = SpikingSelfAttention(dim, n_heads, n_kv_heads, norm_eps, neuron)
        self.mlp_norm = RMSNorm(dim, norm_eps)
        self.mlp_lif = LIF(**neuron)
        self.mlp = SpikingMLP(dim, mlp_hidden, norm_eps, neuron)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_lif(self.attention_norm(x)))
        return x + self.mlp(self.mlp_lif(self.mlp_norm(x)))

    def residual_projections(self) -> tuple[nn.Linear, ...]:
        """The linears that write into the residual stream (scaled down at init)."""
        return self.attention.wo, self.mlp.w2

    def neurons(self) -> dict[str, LIF]:
        """Every LIF layer of the block by metric name: input spikes, Q/K/V, attention output, MLP hidden."""
        return {
            "attn_input": self.attention_lif,
            "q": self.attention.q.lif,
            "k": self.attention.k.lif,
            "v": self.attention.v.lif,
            "attn": self.attention.attn_lif,
            "mlp_input": self.mlp_lif,
            "mlp": self.mlp.hidden.lif,
        }


class SpikingTransformer(Decoder):
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab_size), via T timesteps of spikes.

    Readout: the residual stream is averaged over the T steps (a rate code), then normed and projected
    once. Averaging the logits instead would cost T vocabulary projections for what differs only by
    where the final RMSNorm sits.

    muP (mup=true) is the Decoder's (init, learning rates, readout); the spiking
    attention already divides its scores by head_dim, muP's own attention scaling.
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
        rope_theta: float = 10000.0,  # shared DecoderConfig field; unused: spike-valued Q/K are not rotated
        norm_eps: float = 1e-5,
        tie_embeddings: bool = False,
        init_std: float = 0.02,
        timesteps: int = 4,
        tau: float = 2.0,
        threshold: float = 1.0,
        reset: str = "soft",
        surrogate: str = "sigmoid",
        surrogate_slope: float = 4.0,
        detach_reset: bool = True,
        mup: bool = False,
        mup_base_width: int = 128,
    ):
        if timesteps < 1:
            raise ValueError(f"timesteps={timesteps} must be >= 1")
        neuron = dict(tau=tau, threshold=threshold, reset=reset, surrogate=surrogate, slope=surrogate_slope, detach_reset=detach_reset)

        def build_block() -> SpikingBlock:
            return SpikingBlock(dim, n_heads, n_kv_heads, mlp_hidden, norm_eps, neuron)

        super().__init__(
            vocab_size,
            dim,
            n_layers,
            max_seq_len,
            norm_eps,
            tie_embeddings,
            init_std,
            mup,
            mup_base_width,
            build_block=build_block,
        )
        self.timesteps = timesteps

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded = self.tok_embeddings(tokens)
        # Direct encoding: the embedding is the input current at every timestep.
        x = embedded.unsqueeze(0).expand(self.timesteps, *embedded.shape)
        for layer in self.layers:
            x = layer(x)
        return self.readout(x.mean(0))

    def training_metrics(self) -> dict[str, float]:
        """Firing rate (spikes per neuron per timestep, in [0, 1]) of every LIF layer in the last forward."""
        names, rates = [], []
        for index, layer in enumerate(self.layers):
            for name, lif in layer.neurons().items():
                if lif.last_rate is not None:
                    names.append(f"spiking/layer{index}/{name}_rate")
                    rates.append(lif.last_rate)
        if not rates:
            return {}
        values = torch.stack(rates).tolist()  # one device sync for all layers
        metrics = dict(zip(names, values))
        metrics["spiking/mean_rate"] = sum(values) / len(values)
        return metrics
