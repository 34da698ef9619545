"""Nothing is deleted unasked. `hf export --overwrite` (and `hf import --overwrite`) replaces only a folder the command
wrote itself, never a run folder, a folder holding one, or the source; a new run into a folder an earlier run left
(without a checkpoint to resume) exits 2 naming the folder and the choices, and trainer.resume=auto there starts
again from step 0 with the earlier steps superseded, not mixed in."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from conftest import launch
from currytrain.cli import main


def _fingerprint(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def _export_into_itself(run, tmp_path):
    return ["hf", "export", str(run), str(run), "--overwrite"], run, "holds the source"


def _export_into_its_parent(run, tmp_path):
    return ["hf", "export", str(run), str(run.parent), "--overwrite"], run.parent, "holds the source"


def _export_over_another_run(run, tmp_path):
    other = tmp_path / "runs"
    shutil.copytree(run, other / "exp2")
    return ["hf", "export", str(run), str(other), "--overwrite"], other, "holds a run folder"


def _export_over_a_folder_it_did_not_write(run, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "ideas.txt").write_text("precious\n")
    return ["hf", "export", str(run), str(notes), "--overwrite"], notes, "was not written by curryTrain"


def _import_over_a_run(run, tmp_path):
    from test_hf import make_hf_model

    make_hf_model("LlamaForCausalLM").save_pretrained(tmp_path / "hf")
    return ["hf", "import", str(tmp_path / "hf"), "--out", str(run), "--overwrite"], run, "holds a run folder"


CASES = {
    "hf export RUN RUN --overwrite": _export_into_itself,
    "hf export RUN <its parent> --overwrite": _export_into_its_parent,
    "hf export RUN <a folder holding another run> --overwrite": _export_over_another_run,
    "hf export RUN <a folder it did not write> --overwrite": _export_over_a_folder_it_did_not_write,
    "hf import SRC --out <a run folder> --overwrite": _import_over_a_run,
}


@pytest.mark.reliability(kind="bad input", group="hf")
@pytest.mark.parametrize("case", list(CASES))
def test_overwrite_never_replaces_a_run_folder_or_a_folder_it_did_not_write(case, run_copy, tmp_path, capsys):
    args, guarded, expected = CASES[case](run_copy, tmp_path)
    before = _fingerprint(guarded)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
    assert _fingerprint(guarded) == before, "a file was changed or deleted"


def test_overwrite_replaces_a_folder_export_wrote(run_copy, tmp_path):
    out = tmp_path / "hf_out"
    assert main(["hf", "export", str(run_copy), str(out)]) == 0
    assert main(["hf", "export", str(run_copy / "checkpoints" / "step_2"), str(out), "--overwrite"]) == 0
    assert json.loads((out / ".currytrain-export").read_text())["source"].endswith("step_2")


CRASHED = ("data.max_bytes=300000", "trainer.max_steps=4", "trainer.checkpoint_every=0", "logger=[jsonl]")


@pytest.mark.reliability(kind="bad input", group="trainer")
def test_a_new_run_into_a_folder_an_earlier_run_left_is_refused_naming_the_choices(run_copy, tmp_path):
    shutil.rmtree(run_copy / "checkpoints")  # a run that saved nothing (crashed early, or checkpoint_every=0)
    before = _fingerprint(run_copy)
    result = launch(*CRASHED, f"hydra.run.dir={run_copy}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"{run_copy} already holds an earlier run (journal.jsonl, resolved.yaml, metrics.jsonl)" in result.stderr, result.stderr[-3000:]
    assert "choose another run folder" in result.stderr and "trainer.resume=auto" in result.stderr
    assert _fingerprint(run_copy) == before


def test_resume_auto_without_a_checkpoint_starts_again_and_supersedes_the_earlier_steps(run_copy, tmp_path):
    from currytrain.journal import current, read_journal

    shutil.rmtree(run_copy / "checkpoints")
    result = launch(*CRASHED, "trainer.resume=auto", f"hydra.run.dir={run_copy}")
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_journal(run_copy / "journal.jsonl")
    assert [r["type"] for r in records].count("restart") == 1
    steps = [r["step"] for r in current(records) if r["type"] == "metrics"]
    assert steps == sorted(set(steps)) == [1, 2, 3, 4], "each step once: the earlier attempt's are superseded"
    lines = [json.loads(line) for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "train/loss" in line] == [1, 2, 3, 4], "the earlier attempt's lines were dropped"
