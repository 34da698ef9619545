"""A checkpoint is an untrusted artifact: nothing in it is unpickled beyond an exact allow-list, checked on the
opcodes before anything is built (DCP's .metadata), or beyond plain data (its non-tensor items, through
torch.load(weights_only=True)). Each crafted checkpoint below would create a marker folder if any reader ran it;
every entry point that reads checkpoints refuses it (exit 2; `currytrain verify` exits 1, as for any checkpoint
that fails) and the marker never appears. Checksums are recomputed after each change: they are not signatures."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp

from conftest import launch
from currytrain.checkpoint import dcp_load, metadata_problem, read_metadata
from currytrain.cli import main
from currytrain.safepickle import UnsafePickle
from security.crafted import Mkdir, pickle_tricks, reseal

TRICKS = list(pickle_tricks(Path("/nowhere")))


@pytest.mark.reliability(
    kind="untrusted", artifact="checkpoint .metadata", refused_by="opcode walk against exact (module, name) pairs, then an unpickler of those alone"
)
@pytest.mark.parametrize("trick", TRICKS)
def test_no_pickle_trick_in_a_checkpoints_metadata_runs(trick, run_copy, tmp_path, capsys):
    marker = tmp_path / "ran"
    step = run_copy / "checkpoints" / "step_4"
    (step / ".metadata").write_bytes(pickle_tricks(marker)[trick])
    reseal(step)
    with pytest.raises(UnsafePickle):
        read_metadata(step)
    assert main(["verify", str(run_copy)]) == 1
    out, err = capsys.readouterr()
    assert "step_2: ok" in out and "step_4: .metadata is unsafe to load" in out, out
    assert "Traceback" not in err and not marker.exists(), "the payload ran"


def _crafted_metadata(run_copy, marker):
    step = run_copy / "checkpoints" / "step_4"
    (step / ".metadata").write_bytes(pickle_tricks(marker)["dotted name in an allowed module"])
    reseal(step)
    return step


def _crafted_item(run_copy, marker):
    """step_4 written again by DCP itself with its `step` item replaced by an object whose unpickling calls os.mkdir."""
    step = run_copy / "checkpoints" / "step_4"
    metadata = read_metadata(step).state_dict_metadata
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype) if hasattr(meta, "size") else None for key, meta in metadata.items()}
    dcp_load(state, step)
    state["train.step"] = Mkdir(marker)
    for name in [".metadata", *(p.name for p in step.glob("*.distcp"))]:
        (step / name).unlink()
    dcp.save(state, checkpoint_id=str(step), no_dist=True)
    reseal(step)
    return step


CRAFTED = {"metadata": _crafted_metadata, "non-tensor item": _crafted_item}


def _resume_by_name(run_copy, step, tmp_path):
    return launch(*RUN_MORE, f"trainer.resume={step}", f"hydra.run.dir={tmp_path / 'resumed'}")


def _init_from(run_copy, step, tmp_path):
    return launch(*RUN_MORE, f"trainer.init_from={step}", f"hydra.run.dir={tmp_path / 'fresh'}")


def _export(run_copy, step, tmp_path):
    return SimpleNamespace(returncode=main(["hf", "export", str(step), str(tmp_path / "hf")]), stderr="")


RUN_MORE = ("data.max_bytes=300000", "trainer.max_steps=6", "trainer.eval_every=2", "logger=[jsonl]")
ENTRIES = {"resume by name": _resume_by_name, "init_from": _init_from, "hf export": _export}


@pytest.mark.reliability(
    kind="untrusted", artifact="checkpoint (resume, init_from, hf export)", refused_by="content checks before any load; safe reader and planner in every load"
)
@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("crafted", list(CRAFTED))
def test_a_crafted_checkpoint_is_refused_by_every_reader(crafted, entry, run_copy, tmp_path, capsys):
    marker = tmp_path / "ran"
    step = CRAFTED[crafted](run_copy, marker)
    assert metadata_problem(step) is not None
    result = ENTRIES[entry](run_copy, step, tmp_path)
    err = result.stderr + capsys.readouterr().err
    assert result.returncode == 2, err[-3000:]
    assert "Traceback" not in err and not marker.exists(), "the payload ran"
    assert not (tmp_path / "hf").exists()


@pytest.mark.reliability(
    fault="a crafted non-tensor item in the newest checkpoint", protection="read as plain data only; resume=auto falls back to the newest safe checkpoint"
)
def test_resume_auto_passes_over_a_crafted_checkpoint_to_the_newest_safe_one(run_copy, tmp_path, record_property):
    marker = tmp_path / "ran"
    _crafted_item(run_copy, marker)
    result = launch(*RUN_MORE, "trainer.resume=auto", f"hydra.run.dir={run_copy}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not marker.exists(), "the payload ran"
    from currytrain.journal import read_journal

    events = read_journal(run_copy / "journal.jsonl")
    (corrupt,) = [e for e in events if e["type"] == "checkpoint_corrupt"]
    assert corrupt["path"].endswith("step_4") and "train.step is not plain data" in corrupt["problem"]
    assert [e["path"] for e in events if e["type"] == "resume"][-1].endswith("step_2")
    record_property("data_lost", 0)
