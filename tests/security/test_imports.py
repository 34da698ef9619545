"""An HF import folder is an untrusted artifact: its config.json may point transformers at Python files of its own
(auto_map), and any of its files may be a symbolic link to something private (a tokenizer.json linked to a key).
`currytrain hf import` never runs the folder's code (trust_remote_code=False: the folder's Python is not even
imported) and refuses links; `hf export` refuses links in an import folder's hf/ too. Only the HF cache's own links,
from a snapshot into its blobs, are followed."""

from __future__ import annotations

import json
import os
import shutil

import pytest

pytest.importorskip("transformers")

from test_hf import make_hf_model  # noqa: E402

from currytrain.cli import main  # noqa: E402

EVIL_CODE = "import pathlib\npathlib.Path({marker!r}).mkdir()\nfrom transformers import LlamaConfig as EvilConfig\n"


def _checkpoint(folder, marker, model_type: str) -> None:
    """A tiny Llama checkpoint whose config.json asks for the folder's own configuration code (auto_map)."""
    make_hf_model("LlamaForCausalLM").save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type=model_type, auto_map={"AutoConfig": "configuration_evil.EvilConfig"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_evil.py").write_text(EVIL_CODE.format(marker=str(marker)))


@pytest.mark.reliability(
    kind="untrusted", artifact="HF import folder (auto_map code)", refused_by="trust_remote_code=False: the folder's Python is never imported"
)
@pytest.mark.parametrize("model_type", ["llama", "evil"])
def test_an_import_folders_own_code_never_runs(model_type, tmp_path, capsys):
    """A known model type imports with transformers' own class; an unknown one is refused (exit 2); neither imports
    configuration_evil.py (transformers would ask whether to run it, and run it on a yes)."""
    marker, folder = tmp_path / "ran", tmp_path / "hf"
    _checkpoint(folder, marker, model_type)
    code = main(["hf", "import", str(folder), "--out", str(tmp_path / "imported")])
    err = capsys.readouterr().err
    assert code == (0 if model_type == "llama" else 2), err
    assert not marker.exists(), "the folder's code ran"
    assert (tmp_path / "imported").exists() == (model_type == "llama")


@pytest.mark.reliability(kind="untrusted", artifact="HF import folder (symbolic links)", refused_by="links refused before anything is read or copied")
@pytest.mark.parametrize("command", ["import", "export"])
def test_a_linked_file_in_an_import_folder_is_refused_and_nothing_is_copied(command, tmp_path, capsys):
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY\n")
    folder = tmp_path / "hf"
    make_hf_model("LlamaForCausalLM").save_pretrained(folder)
    if command == "import":
        (folder / "tokenizer.json").symlink_to(secret)
        args = ["hf", "import", str(folder), "--out", str(tmp_path / "out")]
    else:
        assert main(["hf", "import", str(folder), "--out", str(tmp_path / "imported")]) == 0
        (tmp_path / "imported" / "hf" / "tokenizer.json").symlink_to(secret)
        args = ["hf", "export", str(tmp_path / "imported"), str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json is a symbolic link" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_the_hf_caches_own_links_into_its_blobs_are_followed(tmp_path, monkeypatch):
    """The Hub cache stores each file once in blobs/ and links a snapshot's names to them: that is not a link out."""
    make_hf_model("LlamaForCausalLM").save_pretrained(tmp_path / "hf")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "home" / "hub" / "models--tiny-org--linked"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for index, path in enumerate(sorted((tmp_path / "hf").iterdir())):
        shutil.copy(path, repo / "blobs" / f"blob{index}")
        os.symlink(f"../../blobs/blob{index}", repo / "snapshots" / commit / path.name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "home" / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    assert main(["hf", "import", "tiny-org/linked", "--out", str(tmp_path / "imported")]) == 0
    assert (tmp_path / "imported" / "model.safetensors").is_file()
