"""The leakage-safe pipeline (currytrain/data/pipeline.py), tables (data=digits|table, model=mlp) and the digits experiment."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.preprocessing import StandardScaler

from conftest import launch
from currytrain.build import build
from currytrain.data import pipeline
from currytrain.data.tabular import Digits
from currytrain.journal import read_journal
from currytrain.validate import validate


def test_temporal_split_never_puts_a_later_timestamp_in_train():
    times = np.random.default_rng(0).integers(0, 50, size=500)  # many rows share a timestamp
    split = pipeline.temporal_split(times, val_fraction=0.2, test_fraction=0.1)
    assert times[split.train].max() < times[split.val].min()
    assert times[split.val].max() < times[split.test].min()
    assert sorted(np.concatenate([split.train, split.val, split.test])) == list(range(500))


def test_grouped_split_never_shares_a_group_and_follows_the_seed():
    groups = np.random.default_rng(1).integers(0, 40, size=400)
    split = pipeline.grouped_split(groups, val_fraction=0.25, test_fraction=0.1, seed=3)
    parts = [set(groups[rows]) for rows in (split.train, split.val, split.test)]
    assert all(parts) and not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert len(np.concatenate([split.train, split.val, split.test])) == 400
    again, other = pipeline.grouped_split(groups, 0.25, 0.1, seed=3), pipeline.grouped_split(groups, 0.25, 0.1, seed=4)
    assert np.array_equal(again.val, split.val) and not np.array_equal(other.val, split.val)


def _leaks(report: list[pipeline.Leak]) -> dict[str, bool]:
    return {leak.check: leak.leaked for leak in report}


def test_a_normaliser_fitted_on_the_whole_dataset_is_flagged_and_one_fitted_on_train_is_not():
    digits = Digits(val_fraction=0.2, seed=0)  # fitted on its train rows by the pipeline
    assert not any(_leaks(digits.leakage_report()).values()), digits.leakage_report()
    everything = np.concatenate([digits.raw_train, digits.transform.inverse_transform(digits.x["val"].double().numpy())])
    digits.transform = StandardScaler().fit(everything)  # the classic mistake: statistics of train + val
    flagged = _leaks(digits.leakage_report())
    assert flagged["transform fitted on train only"]
    assert not flagged["exact duplicates train/val"] and not flagged["no feature encodes the target"]


def test_duplicated_rows_and_a_feature_copying_the_label_are_flagged():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(300, 5)), rng.integers(0, 3, size=300)
    split = pipeline.random_split(300, 0.2, seed=0)
    val_x = x[split.val].copy()
    val_x[:5] = x[split.train][:5]  # five exact copies of train rows
    val_x[5:10] = x[split.train][5:10] + 1e-4  # five near copies
    clean = _leaks(pipeline.leakage_report({"train": (x[split.train], y[split.train]), "val": (x[split.val], y[split.val])}))
    assert not any(clean.values()), clean
    copied = _leaks(pipeline.leakage_report({"train": (x[split.train], y[split.train]), "val": (val_x, y[split.val])}))
    assert copied["exact duplicates train/val"] and copied["near duplicates train/val"]
    with_label = np.column_stack([x, y * 10.0 + rng.normal(scale=0.1, size=300)])  # a feature derived from the label
    report = pipeline.leakage_report({"train": (with_label[split.train], y[split.train]), "val": (with_label[split.val], y[split.val])}, names=list("abcdeL"))
    leak = next(leak for leak in report if leak.check == "no feature encodes the target")
    assert leak.leaked and "L" in leak.cause


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> str:
    """A CSV of 240 rows: 3 features, a class, a day and a customer id."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("table") / "rows.csv"
    lines = ["f0,f1,f2,label,day,customer"]
    for row in range(240):
        label = int(rng.integers(0, 3))
        features = rng.normal(size=3) + label
        lines.append(f"{features[0]:.4f},{features[1]:.4f},{features[2]:.4f},{label},{row // 8},c{row % 30}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_table_batches_are_a_pure_function_and_ranks_slice_the_global_batch(compose_cfg, table):
    cfg = compose_cfg(
        "model=mlp",
        "~model/size",
        "data=table",
        f"data.path={table}",
        "data.split=temporal",
        "data.time_column=day",
        "data.features=[f0,f1,f2]",
        "model.in_features=3",
        tiny=False,
    )
    assert validate(cfg) == []
    data = build(cfg.data)
    assert data.num_features == 3 and data.describe()["train_rows"] + data.describe()["val_rows"] == 240
    whole = data.batch("train", 5, 1, 8)
    halves = [data.batch("train", 5, 1, 8, rank=rank, num_ranks=2) for rank in range(2)]
    assert torch.equal(torch.cat([h[0] for h in halves]), whole[0]) and torch.equal(torch.cat([h[1] for h in halves]), whole[1])
    assert torch.equal(data.batch("train", 5, 1, 8)[0], whole[0]) and not torch.equal(data.batch("train", 6, 1, 8)[0], whole[0])
    val = torch.cat([data.batch("val", 0, micro, 8)[1] for micro in range(2)])
    assert torch.equal(val, data.y["val"][:16])  # val batches walk the split in order
    # the normaliser saw train rows only: their features have mean 0, the later (val) rows' do not
    assert torch.allclose(data.x["train"].mean(0), torch.zeros(3), atol=1e-5)


@pytest.mark.slow
def test_bad_tables_are_refused_by_validation_naming_the_key(compose_cfg, table, tmp_path):
    base = ("model=mlp", "~model/size", "data=table")
    missing = validate(compose_cfg(*base, f"data.path={table}", "data.target=outcome", "data.split=grouped", tiny=False))
    assert any("data.target: " in p and "'outcome'" in p for p in missing), missing
    assert any("data.split=grouped needs data.group_column" in p for p in missing), missing
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really parquet")
    assert any("data.path=" in p and "cannot be read" in p for p in validate(compose_cfg(*base, f"data.path={broken}", tiny=False))), "a broken parquet file"
    mismatched = validate(compose_cfg("data=digits"))  # a table given to the default decoder
    assert mismatched and "pass model=mlp" in mismatched[0]


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("digits") / "run"
    result = launch("experiment=digits", "trainer.progress=false", f"hydra.run.dir={run_dir}", tiny=False)
    return result, run_dir


@pytest.mark.slow
def test_the_digits_experiment_trains_an_mlp_to_90_percent_val_accuracy(digits_run):
    result, run_dir = digits_run
    assert result.returncode == 0, result.stderr[-3000:]
    evals = [event for event in read_journal(run_dir / "journal.jsonl") if event["type"] == "eval"]
    assert evals and evals[-1]["accuracy"] >= 0.9, evals
    resolved = (run_dir / "resolved.yaml").read_text()
    assert "currytrain.model.mlp.MLPClassifier" in resolved and "currytrain.data.tabular.Digits" in resolved


@pytest.mark.slow
def test_the_ladder_climbs_for_a_table_and_preflight_reports_its_leakage_checks(tmp_path, one_thread):
    """check=sanity on experiment=digits: skeleton (rows, not token windows), preflight (with the split's
    leakage checks) and sanity (init loss ln 10, overfit one batch) all pass: exit 0."""
    result = launch("experiment=digits", "check=sanity", "trainer.progress=false", f"hydra.run.dir={tmp_path / 'run'}", tiny=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = (tmp_path / "run" / "report.md").read_text()
    for check in ("batch shapes", "transform fitted on train only", "near duplicates train/val", "no feature encodes the target", "overfit one batch"):
        assert check in report
    assert "causality" not in report  # a token-sequence probe: rows of features have no positions


def _final_val_loss(run_dir) -> float:
    return next(event["val_loss"] for event in read_journal(run_dir / "journal.jsonl") if event["type"] == "finish")


def test_two_ddp_ranks_train_the_digits_classifier_as_one_process_does(digits_run, tmp_path):
    """The ranks split each global batch of rows (gloo, 2 processes): the same final val loss as one process."""
    result = launch("experiment=digits", "parallel=ddp", "parallel.nproc=2", "trainer.progress=false", f"hydra.run.dir={tmp_path / 'run'}", tiny=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert abs(_final_val_loss(tmp_path / "run") - _final_val_loss(digits_run[1])) < 1e-4
