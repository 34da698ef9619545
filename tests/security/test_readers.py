"""Readers of run folders (journal, compare, diagnose, verify) tolerate damaged files: a line that is not a record is
skipped and named with its number, a config file is read with bounded work, and a checkpoint whose marker lists no
checksums is still checked against what its metadata says. A fuzz of the three files they read most (journal lines,
resolved.yaml, COMPLETE markers) asserts no traceback and no hang: every reader returns, or refuses with exit 2."""

from __future__ import annotations

import json
import string
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from currytrain.cli import main
from currytrain.errors import ConfigError
from currytrain.journal import read_journal, timeline
from currytrain.weights import MARKER, checkpoint_problem, checkpoint_step, marker_config, model_node_of, read_yaml_mapping


def _torn(run):
    """A power cut mid-line, then a relaunch whose first record was appended to the torn line (before appends
    started a new line): the torn record is lost, the relaunch's is recovered."""
    lines = (run / "journal.jsonl").read_text().splitlines(keepends=True)
    glued = lines[3][: len(lines[3]) // 2] + json.dumps({"type": "launch", "time": "2026-01-01T00:00:00+00:00", "seed": 0})
    (run / "journal.jsonl").write_text("".join(lines[:3] + [glued + "\n"] + lines[4:]))
    return 4


@pytest.mark.reliability(
    kind="untrusted", artifact="journal.jsonl with a torn middle line", refused_by="the line skipped and named; the record glued onto it recovered"
)
@pytest.mark.parametrize("command", ["journal", "compare", "diagnose"])
def test_a_torn_journal_line_is_skipped_and_named_by_every_reader(command, run_copy, tmp_path, capsys):
    number = _torn(run_copy)
    records = read_journal(run_copy / "journal.jsonl")
    assert records.skipped and records.skipped[0].startswith(f"line {number}: not JSON") and "recovered" in records.skipped[0]
    assert any(r["type"] == "launch" for r in records)
    args = {"journal": [str(run_copy)], "compare": [str(run_copy), "--out", str(tmp_path / "cmp")], "diagnose": [str(run_copy)]}[command]
    assert main([command, *args]) == 0
    out, err = capsys.readouterr()
    assert f"line {number}" in out and "Traceback" not in err, out + err


@pytest.mark.reliability(
    kind="untrusted", artifact="checkpoint whose marker lists no checksums", refused_by="every item checked against the shard its metadata places it in"
)
def test_verify_finds_a_truncated_shard_even_when_the_marker_lists_no_files(run_copy, capsys):
    step = run_copy / "checkpoints" / "step_4"
    marker = json.loads((step / MARKER).read_text())
    (step / MARKER).write_text(json.dumps({**marker, "files": None}))  # as a checkpoint from before checksums
    shard = next(step.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    assert checkpoint_problem(step) is None, "nothing to check the shard against in the marker"
    assert main(["verify", str(run_copy)]) == 1
    out, err = capsys.readouterr()
    assert f"step_4: {shard.name} has" in out and "(truncated)" in out and "step_2: ok" in out, out
    assert "Traceback" not in err


# ------------------------------------------------------------------------------------------------- the fuzz

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=12))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
KEYS = ["type", "step", "time", "val_loss", "train/loss", "message", "traceback", "path", "seed", "git_sha", "overrides"]
RECORDS = st.dictionaries(st.sampled_from(KEYS), JSON | st.sampled_from(["metrics", "eval", "finish", "failure", "header", "2026-01-01T00:00:00"]), max_size=6)
LINES = st.one_of(
    RECORDS.map(json.dumps), JSON.map(json.dumps), st.text(alphabet=string.printable, max_size=40), st.binary(max_size=40).map(lambda b: b.decode("latin-1"))
)


def _bounded(call, seconds: float = 10.0):
    """Run `call` in a thread: a reader that does not return within `seconds` is a hang."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(_outcome(call)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the reader hangs"
    if isinstance(result[0], BaseException) and not isinstance(result[0], ConfigError):
        raise result[0]  # a traceback the user would see
    return result[0]


def _outcome(call):
    try:
        return call()
    except BaseException as error:  # a ConfigError (a refusal naming the file) is an answer; _bounded raises the rest
        return error


@FUZZ
@given(lines=st.lists(LINES, max_size=8))
def test_fuzzed_journal_lines_are_read_or_skipped_never_raised(lines, tmp_path_factory):
    run = tmp_path_factory.mktemp("journal")
    (run / "journal.jsonl").write_text("\n".join(line.replace("\n", " ") for line in lines) + "\n", errors="surrogateescape")
    records = _bounded(lambda: read_journal(run / "journal.jsonl"))
    assert len(records) + len(records.skipped) <= len([line for line in lines if line.strip()]) + 1
    _bounded(lambda: timeline(records))
    from currytrain.report.diagnose import diagnose

    findings = _bounded(lambda: diagnose(run))
    assert not isinstance(findings, BaseException) or isinstance(findings, ConfigError), findings


def test_a_start_record_without_its_time_is_drawn_in_the_timeline(tmp_path):
    """Found by the fuzz above: a header or launch line with no time stopped `currytrain journal` with a KeyError."""
    (tmp_path / "journal.jsonl").write_text('{"type": "header", "seed": 1}\n{"type": "launch"}\n{"type": "finish", "step": 3}\n')
    lines = timeline(read_journal(tmp_path / "journal.jsonl"))
    assert len(lines) == 3 and "header" in lines[0] and "seed 1" in lines[0] and "finish" in lines[2], lines


YAML_TEXT = st.one_of(
    JSON.map(lambda tree: json.dumps({"model": tree, "seed": 0})),
    st.text(alphabet=string.printable, max_size=80),
    st.lists(
        st.sampled_from(["a: &x [1, 2]", "b: [*x, *x]", "c: ${a}${a}", "d: ${oc.env:HOME}", "model: {_target_: os.system}", "- 1", "{", "seed: 1e400"]),
        max_size=5,
    ).map("\n".join),
)


@FUZZ
@given(text=YAML_TEXT)
def test_fuzzed_resolved_yaml_is_read_or_refused_never_raised(text, tmp_path_factory):
    run = tmp_path_factory.mktemp("resolved")
    (run / "resolved.yaml").write_text(text)
    (run / "journal.jsonl").write_text("")
    for reader in (lambda: read_yaml_mapping(run / "resolved.yaml"), lambda: model_node_of(run)):
        result = _bounded(reader)
        assert not isinstance(result, BaseException) or isinstance(result, ConfigError), repr(result)
    from currytrain.eval.source import codec_problem, run_config
    from currytrain.report.runs import load_run

    result = _bounded(lambda: codec_problem(run_config(run)))
    assert not isinstance(result, BaseException) or isinstance(result, ConfigError), repr(result)
    result = _bounded(lambda: load_run(run))
    assert not isinstance(result, BaseException) or isinstance(result, ConfigError), repr(result)


@FUZZ
@given(marker=JSON | RECORDS | st.text(max_size=30))
def test_fuzzed_complete_markers_are_read_or_refused_never_raised(marker, tmp_path_factory):
    step = tmp_path_factory.mktemp("ckpt") / "step_3"
    step.mkdir()
    (step / MARKER).write_text(json.dumps(marker) if not isinstance(marker, str) else marker)
    (step / "__0_0.distcp").write_bytes(b"\0" * 16)
    for reader in (lambda: checkpoint_problem(step), lambda: checkpoint_step(step), lambda: marker_config(step), lambda: model_node_of(step)):
        result = _bounded(reader)
        assert not isinstance(result, BaseException) or isinstance(result, ConfigError), repr(result)


@pytest.mark.reliability(
    kind="untrusted",
    artifact="run folder's resolved.yaml (diagnose --anomaly)",
    refused_by="validated as a launch is, its own build.allow dropped, before anything is built",
)
def test_diagnose_anomaly_never_builds_what_a_run_folder_names(run_copy, tmp_path, capsys):
    """--anomaly re-runs a run's config to find the first non-finite module: the config is the run folder's own."""
    import yaml

    marker = tmp_path / "ran"
    resolved = yaml.safe_load((run_copy / "resolved.yaml").read_text())
    resolved["build"] = {"allow": ["builtins"]}  # what the run folder would allow, module-wide
    resolved["data"] = {"_target_": "builtins.open", "file": str(marker), "mode": "w"}
    (run_copy / "resolved.yaml").write_text(yaml.safe_dump(resolved))
    with (run_copy / "journal.jsonl").open("a") as journal:  # a non-finite loss: what --anomaly looks into
        journal.write(json.dumps({"type": "metrics", "time": "2026-01-01T00:00:00+00:00", "step": 3, "train/loss": float("nan")}) + "\n")
    assert main(["diagnose", str(run_copy), "--anomaly"]) == 2
    err = capsys.readouterr().err
    assert "--anomaly does not re-run" in err and "data._target_=builtins.open is not a registered component" in err, err
    assert "Traceback" not in err and not marker.exists(), "the run folder's target was built"


def _bomb(run, marker):
    """resolved.yaml whose last key doubles 40 times: 2**40 characters for a reader that resolves it."""
    lines = ["l0: x"] + [f"l{n}: ${{l{n - 1}}}${{l{n - 1}}}" for n in range(1, 41)]
    (run / "resolved.yaml").write_text((run / "resolved.yaml").read_text() + "\n".join(lines) + "\n")


def _gadget_model(run, marker):
    """The latest checkpoint's marker names the model as builtins.open of the marker path (its files' checksums hold)."""
    step = run / "checkpoints" / "step_4"
    complete = json.loads((step / MARKER).read_text())
    (step / MARKER).write_text(json.dumps({**complete, "model": {"_target_": "builtins.open", "file": str(marker), "mode": "w"}}))


@pytest.mark.reliability(
    kind="untrusted",
    artifact="run folder read by generate and eval (resolved.yaml, the checkpoint's model node)",
    refused_by="resolved.yaml read with bounded work, the model built by exact registered target",
)
@pytest.mark.parametrize("craft", [_bomb, _gadget_model], ids=["nested interpolations", "gadget model target"])
@pytest.mark.parametrize("command", [["generate", "--prompt", "a", "--max-new-tokens", "2"], ["eval"]], ids=["generate", "eval"])
def test_generate_and_eval_neither_expand_nor_build_what_a_run_folder_names(command, craft, run_copy, tmp_path, capsys):
    marker = tmp_path / "ran"
    craft(run_copy, marker)
    assert _bounded(lambda: main([command[0], str(run_copy), *command[1:]])) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not marker.exists(), err
    assert ("interpolation" in err) if craft is _bomb else ("builtins.open is not a registered component" in err), err


# ------------------------------------------------------------------------------------------------- the token cache


def _pickled_document_ends(cache, marker):
    """A shard's .idx as numpy writes an object array: a pickle whose items reduce to os.mkdir(marker)."""
    from security.crafted import Mkdir

    with (cache / "shard-000000.idx").open("wb") as handle:
        np.save(handle, np.array([Mkdir(marker), Mkdir(marker)], dtype=object), allow_pickle=True)


def _cut(name):
    def cut(cache, marker):
        path = next(cache.glob(name))
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    return cut


TOKEN_CACHE_DAMAGE = {
    "a shard's ids cut short": _cut("shard-*.bin"),
    "meta.json of the wrong shape": lambda cache, marker: (cache / "meta.json").write_text('{"dtype": "object"}'),
    "meta.json naming a shard outside the cache": lambda cache, marker: (cache / "meta.json").write_text(
        json.dumps({**json.loads((cache / "meta.json").read_text()), "shards": [{"index": "../../x", "tokens": 1, "docs": 1}]})
    ),
    "a shard's document ends an object array of pickles": _pickled_document_ends,
}


@pytest.mark.reliability(
    kind="untrusted",
    artifact="token cache (data=tokens)",
    refused_by="meta.json's shape, the shards' sizes and shapes checked against it; .idx and split files read without pickle",
)
@pytest.mark.parametrize("damage", list(TOKEN_CACHE_DAMAGE), ids=list(TOKEN_CACHE_DAMAGE))
def test_a_damaged_token_cache_is_refused_naming_it_and_kept(damage, tmp_path):
    pytest.importorskip("tokenizers")
    from tiny_tokenizer import train_tokenizer, write_corpus

    from currytrain.data.tokens import TokenizedText

    tokenizer, text, marker = train_tokenizer(tmp_path / "tokenizer"), write_corpus(tmp_path / "text", num_files=4, repeat=5), tmp_path / "ran"
    build = lambda: TokenizedText(str(tokenizer), [str(text)], seq_len=16, cache_dir=str(tmp_path / "cache"))  # noqa: E731
    cache = build().cache
    TOKEN_CACHE_DAMAGE[damage](cache, marker)
    kept = {path.name: path.read_bytes() for path in cache.rglob("*") if path.is_file()}
    with pytest.raises(ConfigError, match="is damaged") as refused:
        build()
    assert str(cache) in str(refused.value) and "data.cache_dir" in str(refused.value)
    assert {path.name: path.read_bytes() for path in cache.rglob("*") if path.is_file()} == kept, "the cache was changed"
    assert not marker.exists()


def test_a_token_cache_split_outside_its_shards_is_cut_again(tmp_path):
    """A split file is derived data: one whose spans leave the shards (or hold pickles) is not read, and is cut
    again from the shards."""
    pytest.importorskip("tokenizers")
    from tiny_tokenizer import train_tokenizer, write_corpus

    from currytrain.data.tokens import TokenizedText
    from security.crafted import Mkdir

    tokenizer, text, marker = train_tokenizer(tmp_path / "tokenizer"), write_corpus(tmp_path / "text", num_files=4, repeat=5), tmp_path / "ran"
    build = lambda: TokenizedText(str(tokenizer), [str(text)], seq_len=16, cache_dir=str(tmp_path / "cache"))  # noqa: E731
    first = build()
    [split] = first.cache.glob("split-*.npz")
    with np.load(split) as saved:
        honest = {name: saved[name].copy() for name in ("train", "val")}
    train = honest["train"].copy()
    train[0, 1], train[0, 2] = 10**9, 10**9 + int(train[0, 2] - train[0, 1])  # the same token count, far past the shard
    for crafted in (train, np.array([Mkdir(marker)], dtype=object)):
        np.savez(split, train=crafted, val=honest["val"])
        again = build()
        with np.load(split) as saved:
            assert all(np.array_equal(saved[name], honest[name]) for name in honest), "the split was cut again"
        assert not marker.exists()
        assert torch.equal(again.batch("train", 3, 0, 4)[0], first.batch("train", 3, 0, 4)[0])
