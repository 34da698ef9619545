"""Corrupted checkpoints are never loaded: the manifest in COMPLETE (size + SHA-256 of each file) catches a
shard cut short, bytes changed inside a shard (same size) and a missing .metadata; a resume falls back to
the newest intact checkpoint, journaled and warned; `currytrain verify` names the bad file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf

from currytrain.errors import ConfigError
from currytrain.journal import read_journal
from currytrain.run import write_run_record
from currytrain.trainer.trainer import Trainer
from currytrain.weights import checkpoint_problem

STEPS = ("data.max_bytes=300000", "trainer.max_steps=6", "trainer.checkpoint_every=2", "trainer.keep_last=3", "logger=[jsonl]")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One tiny run with complete checkpoints at steps 2, 4 and 6."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from conftest import CONF, TINY
    from currytrain.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*TINY, *STEPS])
    GlobalHydra.instance().clear()
    run_dir = tmp_path_factory.mktemp("saved")
    torch.set_num_threads(1)
    Trainer(OmegaConf.load(write_run_record(cfg, run_dir, [], run_dir)), run_dir).train()
    return run_dir


def _norm_weight_location(step_dir: Path) -> tuple[Path, int, int]:
    """(file, offset, length) of the final norm's weight inside a DCP checkpoint: ones, whose loss when
    zeroed is silent (the model still runs, only worse)."""
    metadata = dcp.FileSystemReader(str(step_dir)).read_metadata()
    (index, info), *_ = [(i, s) for i, s in metadata.storage_data.items() if i.fqn == "train.model.norm.weight"]
    return step_dir / info.relative_path, info.offset, info.length


def _truncate(step: Path) -> str:
    shard = next(step.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return f"{shard.name} has"


def _zero_norm(step: Path) -> str:
    file, offset, length = _norm_weight_location(step)
    data = bytearray(file.read_bytes())
    data[offset : offset + length] = bytes(length)
    file.write_bytes(bytes(data))
    return f"{file.name} differs from its checksum"


def _drop_metadata(step: Path) -> str:
    (step / ".metadata").unlink()
    return "is missing .metadata"


CORRUPTIONS = {"truncated shard": _truncate, "zeroed norm weight (same size)": _zero_norm, "deleted .metadata": _drop_metadata}


@pytest.fixture
def corrupted(saved, tmp_path, request):
    run_dir = tmp_path / "run"
    shutil.copytree(saved, run_dir)
    expected = CORRUPTIONS[request.param](run_dir / "checkpoints" / "step_6")
    return run_dir, expected


def _resumed(run_dir: Path, resume: str) -> Trainer:
    cfg = OmegaConf.load(run_dir / "resolved.yaml")
    cfg.trainer.resume, cfg.trainer.max_steps = resume, 8
    return Trainer(cfg, run_dir)


@pytest.mark.reliability(fault="corrupted newest checkpoint", protection="manifest checksums; resume falls back to the newest intact one")
@pytest.mark.parametrize("corrupted", list(CORRUPTIONS), indirect=True)
def test_a_corrupted_checkpoint_is_detected_and_resume_falls_back(corrupted, saved, one_thread, record_property, caplog):
    run_dir, expected = corrupted
    step_6, step_4 = run_dir / "checkpoints" / "step_6", run_dir / "checkpoints" / "step_4"
    assert expected in checkpoint_problem(step_6)
    assert checkpoint_problem(step_4) is None
    trainer = _resumed(run_dir, "auto")
    assert trainer.maybe_resume()
    assert trainer.step == 4, "the newest intact checkpoint is step 4"
    reference = {name: torch.zeros_like(value) for name, value in trainer.module.state_dict().items()}
    dcp.load({"train": {"model": reference}}, checkpoint_id=str(saved / "checkpoints" / "step_4"), no_dist=True)
    assert all(torch.equal(reference[name], value) for name, value in trainer.module.state_dict().items())
    events = read_journal(run_dir / "journal.jsonl")
    (corrupt,) = [e for e in events if e["type"] == "checkpoint_corrupt"]
    assert corrupt["path"].endswith("step_6") and expected in corrupt["problem"]
    assert [e["path"] for e in events if e["type"] == "resume"][-1].endswith("step_4")
    assert "not loading it, trying an earlier one" in caplog.text
    record_property("data_lost", 0)


@pytest.mark.reliability(fault="corrupted checkpoint named explicitly", protection="trainer.resume=<step folder> refuses it (exit 2)")
def test_resuming_a_corrupted_checkpoint_by_name_is_refused(saved, tmp_path, one_thread, record_property):
    run_dir = tmp_path / "run"
    shutil.copytree(saved, run_dir)
    _zero_norm(run_dir / "checkpoints" / "step_6")
    with pytest.raises(ConfigError, match="no checkpoint in .*step_6 passes its checksums"):
        _resumed(run_dir, str(run_dir / "checkpoints" / "step_6")).maybe_resume()
    record_property("data_lost", 0)


def test_verify_names_the_corrupted_checkpoint_and_its_file(saved, tmp_path, capsys):
    from currytrain.cli import main

    run_dir = tmp_path / "run"
    shutil.copytree(saved, run_dir)
    _zero_norm(run_dir / "checkpoints" / "step_4")
    assert main(["verify", str(saved)]) == 0
    assert capsys.readouterr().out.split("\n")[:3] == ["step_2: ok", "step_4: ok", "step_6: ok"]
    assert main(["verify", str(run_dir)]) == 1
    out, err = capsys.readouterr()
    assert "step_4: __0_0.distcp differs from its checksum" in out and "step_6: ok" in out
    assert "1 of 3 checkpoints cannot be loaded (step_4)" in err and "Traceback" not in err


class _Payload:
    """Pickles to a call of os.mkdir: a stand-in for any code a crafted .metadata would run."""

    def __init__(self, target: Path):
        self.target = str(target)

    def __reduce__(self):
        import os

        return (os.mkdir, (self.target,))


@pytest.mark.reliability(fault="crafted .metadata that runs code when unpickled", protection="restricted unpickler check before torch loads it")
def test_a_crafted_metadata_file_is_never_unpickled(saved, tmp_path, one_thread, record_property):
    import json
    import pickle

    from currytrain.weights import MARKER, file_digests

    run_dir = tmp_path / "run"
    shutil.copytree(saved, run_dir)
    step_6, ran = run_dir / "checkpoints" / "step_6", tmp_path / "payload_ran"
    (step_6 / ".metadata").write_bytes(pickle.dumps(_Payload(ran)))
    marker = json.loads((step_6 / MARKER).read_text())
    (step_6 / MARKER).write_text(json.dumps({**marker, "files": file_digests(step_6)}))  # checksums that match: only the content betrays it
    assert checkpoint_problem(step_6) is None
    trainer = _resumed(run_dir, "auto")
    assert trainer.maybe_resume() and trainer.step == 4
    assert not ran.exists(), "the payload ran"
    (corrupt,) = [e for e in read_journal(run_dir / "journal.jsonl") if e["type"] == "checkpoint_corrupt"]
    assert ".metadata names posix.mkdir, which it may not hold" in corrupt["problem"]
    record_property("data_lost", 0)
