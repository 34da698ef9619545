"""currytrain estimate: FLOPs from the model, time assumed from the cost option (or measured here), money."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from currytrain.benchmark import model_flops_per_token
from currytrain.cli import main as currytrain_main
from currytrain.cost.estimate import estimate_cost, run_tokens
from currytrain.model import build_model
from currytrain.validate import validate


def test_the_assumed_estimate_is_flops_over_mfu_of_peak_and_money_per_device_hour(compose_cfg):
    cfg = compose_cfg("cost=h100", "cost.num_devices=8", "cost.measure=false", "cost.launch_seconds=0")  # compute-bound
    estimate = estimate_cost(cfg, tokens=2e9)
    per_token = model_flops_per_token(build_model(cfg.model), cfg.model.n_layers, cfg.model.dim, cfg.data.seq_len)
    assert estimate.flops_per_token == per_token and estimate.flops == pytest.approx(2e9 * per_token)
    assert estimate.seconds == pytest.approx(estimate.flops / (989e12 * 0.4 * 8))
    assert estimate.device_hours == pytest.approx(estimate.seconds * 8 / 3600) and estimate.money == pytest.approx(estimate.device_hours * 3.0)
    assert estimate.method.startswith("assumed: 40% MFU")
    assert estimate_cost(cfg).tokens == run_tokens(cfg) == cfg.trainer.max_steps * cfg.trainer.batch_size * cfg.data.seq_len


def test_a_present_device_is_measured(compose_cfg, one_thread):
    cfg = compose_cfg("cost=cpu", "data.max_bytes=300000")
    estimate = estimate_cost(cfg, tokens=1e6, measure_steps=2)
    assert estimate.method == "measured here on cpu" and estimate.tokens_per_s > 0
    assert estimate.seconds == pytest.approx(1e6 / estimate.tokens_per_s) and estimate.money == 0.0


def test_cli_estimate_prints_json_and_refuses_an_unknown_accelerator(capsys):
    assert currytrain_main(["estimate", "--gpu", "a100", "--tokens", "1e9", "--json", "cost.measure=false"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["accelerator"] == "A100 SXM" and printed["tokens"] == 1e9 and printed["money"] > 0
    assert currytrain_main(["estimate", "--gpu", "tpu"]) == 2
    assert "cost=tpu: cost has no option 'tpu': choose from ['a100', 'cpu', 'h100']" in capsys.readouterr().err


def test_a_small_model_on_a_large_device_is_bound_by_kernel_launches(compose_cfg):
    """40% MFU of an H100 for a model of 30k parameters would be 10^9 tokens/s; its step launches a few hundred
    kernels whatever their size, so the assumed time is theirs and the MFU it implies is tiny. A model large enough
    to fill the device keeps cost.mfu."""
    tiny = estimate_cost(compose_cfg("cost=h100", "cost.measure=false"), tokens=1e9)
    assert tiny.method.startswith("assumed: bound by kernel launches") and "MFU of 9.89e+14 FLOP/s" in tiny.method
    implied = tiny.tokens_per_s * tiny.flops_per_token / 989e12
    assert implied < 0.01 and f"{implied:.2%} MFU" in tiny.method
    large = estimate_cost(compose_cfg("cost=h100", "cost.measure=false", "model/size=small", "trainer.batch_size=64", tiny=False), tokens=1e9)
    assert large.method.startswith("assumed: 40% MFU") and large.tokens_per_s == pytest.approx(989e12 * 0.4 / large.flops_per_token)


def test_cost_settings_are_validated_with_their_key(compose_cfg):
    problems = validate(compose_cfg("cost.mfu=1.5", "cost.device=tpu"))
    assert any(p.startswith("cost.mfu=1.5 must be in (0, 1]") for p in problems), problems
    assert any(p.startswith("cost.device=tpu is not one of ['cpu', 'cuda']") for p in problems), problems


@pytest.mark.parametrize("command", [["estimate"], ["advise", "--gpus", "2", "--gpu-mem", "1GiB"], ["bench", "--steps", "1", "--warmup", "0"]])
def test_a_run_folders_config_is_checked_before_a_tool_builds_from_it(compose_cfg, tmp_path, capsys, command):
    """estimate, advise and bench on a run folder: its resolved.yaml is untrusted data (an edited file, a shared
    folder); a _target_ curryTrain does not register is refused by name before anything is built, exit 2."""
    data = OmegaConf.to_container(compose_cfg(), resolve=True)
    data["model"]["_target_"] = "os.system"
    data["build"] = {"allow": ["os.system"]}  # a run folder's own allow-list is not the reader's to trust
    (tmp_path / "resolved.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(data)))
    assert currytrain_main([command[0], str(tmp_path), *command[1:]]) == 2
    assert "os.system" in capsys.readouterr().err
    data["model"]["_target_"] = "currytrain.model.gqa.GQATransformer"
    (tmp_path / "resolved.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(data)))
    assert currytrain_main([command[0], str(tmp_path), *command[1:], *(["--json"] if command[0] != "bench" else [])]) == 0
