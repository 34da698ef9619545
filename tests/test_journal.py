"""The journal's reproducibility record: git state (tracked and untracked changes) and the config diff."""

from __future__ import annotations

import subprocess

from currytrain.journal import Journal, config_diff, git_state, read_journal


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_git_state_sees_tracked_and_untracked_changes(tmp_path):
    assert git_state(tmp_path)["sha"] is None  # not a repository
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "start")
    (tmp_path / "model.py").write_text("x = 1\n")
    _git(tmp_path, "add", "model.py")
    _git(tmp_path, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "-m", "model")
    clean = git_state(tmp_path)
    assert len(clean["sha"]) == 40 and clean["dirty"] is False and clean["untracked"] == []

    (tmp_path / "my_idea.py").write_text("y = 2\n")
    untracked = git_state(tmp_path)
    assert untracked["dirty"] is True and untracked["untracked"] == ["my_idea.py"] and untracked["diff"] == ""

    (tmp_path / "model.py").write_text("x = 3\n")
    journal = Journal(tmp_path / "run" / "journal.jsonl")
    journal.header(seed=1, world_size=1, overrides=["seed=1"], diff={}, cwd=tmp_path)
    header = read_journal(journal.path)[0]
    assert header["git_dirty"] is True and header["git_untracked"] == ["my_idea.py"]
    assert "-x = 1" in (tmp_path / "run" / "git.diff").read_text()


def test_config_diff_lists_changed_added_and_removed_keys():
    defaults = {"model": {"dim": 128, "ac": "none"}, "seed": 0}
    config = {"model": {"dim": 64, "ac": "none", "moe_k": 2}, "seed": 0}
    assert config_diff(config, defaults) == {
        "model.dim": {"default": 128, "value": 64},
        "model.moe_k": {"default": None, "value": 2},
    }
