"""The Decoder base keeps every family's init and outputs: moe and spiking fingerprints (gqa's is in test_mup.py)."""

from __future__ import annotations

import pytest
import torch

from currytrain.model.moe import MoETransformer
from currytrain.model.spiking import SpikingTransformer

DEBUG = dict(vocab_size=256, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, mlp_hidden=384, max_seq_len=128)

# Taken at commit 433aa7e, before the families shared Decoder: seed 0, debug sizes, muP at four times mup_base_width=32
# (so hidden and residual stds differ from the base ones). sum of squares of all matrices and expert stacks,
# the first values of the residual writes, a hidden matrix and the readout, and logits of arange(32).
FINGERPRINTS = {
    ("moe", False): dict(
        sumsq=583.7901634345523,
        first={
            "layers.0.attention.wo.weight": [0.01694655418395996, -0.0019326377660036087, 0.012292263098061085],
            "layers.3.moe.experts.w2": [-0.0015695568872615695, 0.0016079583438113332, -0.004707878455519676],
            "layers.3.moe.shared_expert.w2.weight": [0.00819891132414341, -0.004758007824420929, -0.0026757270097732544],
            "layers.2.moe.router.gate.weight": [0.028886904940009117, 0.024955488741397858, 0.019739823415875435],
            "output.weight": [0.026637334376573563, 0.004304366186261177, 0.04618537425994873],
        },
        last_logits=[0.16764892637729645, 0.3557145297527313, -0.18713507056236267],
        logits_meansq=0.04810343916277539,
    ),
    ("moe", True): dict(
        sumsq=165.76448980621174,
        first={
            "layers.0.attention.wo.weight": [0.00847327709197998, -0.0009663188830018044, 0.006146131549030542],
            "layers.3.moe.experts.w2": [-0.0007847784436307847, 0.0008039791719056666, -0.002353939227759838],
            "layers.3.moe.shared_expert.w2.weight": [0.004099455662071705, -0.0023790039122104645, -0.0013378635048866272],
            "layers.2.moe.router.gate.weight": [0.014443452470004559, 0.012477744370698929, 0.009869911707937717],
            "output.weight": [0.026637334376573563, 0.004304366186261177, 0.04618537425994873],
        },
        last_logits=[0.030232759192585945, 0.09405556321144104, -0.042299676686525345],
        logits_meansq=0.0031061001922305705,
    ),
    ("spiking", False): dict(
        sumsq=170.05281480936904,
        first={
            "layers.0.attention.wo.weight": [-0.0015349355526268482, 0.0021743655670434237, 0.01008898951113224],
            "layers.3.mlp.w2.weight": [0.010967768728733063, 0.00506022060289979, -0.005663628689944744],
            "layers.1.attention.q.linear.weight": [-0.01092597097158432, -0.0109729478135705, 0.01480883453041315],
            "output.weight": [0.00012190259440103546, 0.016268953680992126, 0.010070202872157097],
        },
        last_logits=[-0.07944832742214203, 0.01191779039800167, 0.0557624027132988],
        logits_meansq=0.05074088426144002,
    ),
    ("spiking", True): dict(
        sumsq=62.182733961611504,
        first={
            "layers.0.attention.wo.weight": [-0.0007674677763134241, 0.0010871827835217118, 0.00504449475556612],
            "layers.3.mlp.w2.weight": [0.005483884364366531, 0.002530110301449895, -0.002831814344972372],
            "layers.1.attention.q.linear.weight": [-0.00546298548579216, -0.00548647390678525, 0.007404417265206575],
            "output.weight": [0.00012190259440103546, 0.016268953680992126, 0.010070202872157097],
        },
        last_logits=[-0.03987007588148117, -0.016937917098402977, -0.0004114725161343813],
        logits_meansq=0.003155016800661003,
    ),
}


def _model(family: str, mup: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    extra = dict(mup=True, mup_base_width=32) if mup else {}
    if family == "moe":
        return MoETransformer(**DEBUG, shared_expert=True, **extra)
    return SpikingTransformer(**DEBUG, **extra)


@pytest.mark.parametrize("family, mup", sorted(FINGERPRINTS))
@pytest.mark.usefixtures("one_thread")
def test_seed_gives_the_weights_and_logits_of_before_the_decoder_base(family, mup):
    expected = FINGERPRINTS[family, mup]
    model = _model(family, mup)
    sumsq = sum(p.double().pow(2).sum() for p in model.parameters() if p.dim() >= 2).item()
    assert sumsq == pytest.approx(expected["sumsq"], rel=1e-9)
    state = model.state_dict()
    for name, values in expected["first"].items():
        assert state[name].flatten()[:3].tolist() == pytest.approx(values, rel=1e-6), name
    with torch.no_grad():
        logits = model(torch.arange(32).reshape(2, 16))
    assert logits[1, -1, :3].tolist() == pytest.approx(expected["last_logits"], rel=1e-4, abs=1e-6)
    assert logits.double().pow(2).mean().item() == pytest.approx(expected["logits_meansq"], rel=1e-5)
