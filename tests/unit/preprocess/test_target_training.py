"""``etl preprocess`` with TargetEncode: a run that fits transforms its rows as training rows (out of fold), a run with
fitted artifacts as other rows (full statistics) unless told otherwise, each agreeing exactly with the pandas
reference, on 1 and 2 threads and on a Dask cluster (the same bytes); the manifest records which, a rerun that
transforms otherwise redoes every shard, a pipeline without TargetEncode records nothing; the exchange by key
(History) carries the training rows too, and refuses position folds it cannot keep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import ConfigError
from etl.io.processed import read_manifest
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import parse_schema
from tests.conftest import tree_bytes
from tests.unit.ops.target_reference import encode, position_folds, value_folds

SCHEMA = parse_schema({"name": "events", "columns": [
    {"name": "label", "role": "label", "dtype": "int64"},
    {"name": "u", "role": "categorical", "dtype": "int64", "encoding": "int"},
    {"name": "i", "role": "categorical", "dtype": "string", "encoding": "string"},
    {"name": "t", "role": "dense", "dtype": "int64"},
    {"name": "rid", "role": "passthrough", "dtype": "int64"},
]})  # fmt: skip
GROUPS = [["i"], ["u", "i"]]
TE = {"op": "TargetEncode", "columns": GROUPS, "target": "label", "kfold": 3, "seed": 7, "smoothing": 4, "export_fold": True}


def pipeline(*extra: dict, **te) -> Pipeline:
    ops = [{"op": "Decode", "columns": ["u", "i"]}, {"op": "Categorify", "columns": ["u", "i"]}, *extra, TE | te]
    return Pipeline({"name": "te", "ops": ops}, SCHEMA)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    rng = np.random.default_rng(11)
    n = 2_400
    table = pa.table({"label": rng.integers(0, 2, n), "u": rng.integers(0, 50, n), "i": [f"i{k}" for k in rng.integers(0, 30, n)],
                      "t": rng.integers(0, 10**6, n), "rid": np.arange(n)})  # fmt: skip
    raw = tmp_path_factory.mktemp("te-run") / "raw"
    raw.mkdir()
    paths = []
    for k, (a, b) in enumerate([(0, 1_000), (1_000, 1_900), (1_900, n)]):
        paths.append(raw / f"day-{k}.parquet")
        pq.write_table(table.slice(a, b - a), paths[-1], row_group_size=256)
    return paths


def raw_rows(shards: list[Path]) -> pd.DataFrame:
    return pd.concat([pq.read_table(p).to_pandas() for p in shards], ignore_index=True)


def output(out: Path) -> pd.DataFrame:
    return pd.concat([pq.read_table(out / e.output).to_pandas() for e in read_manifest(out).files], ignore_index=True)


def check_against_reference(shards: list[Path], got: pd.DataFrame, training: bool, fold_by: str | None = None) -> None:
    """``got`` (the output, in any row order) agrees with the reference: folds from the documented hashes, encodings
    from the statistics of every row."""
    raw = raw_rows(shards)
    got = got.set_index("rid").loc[raw["rid"]].reset_index()
    if fold_by is None:
        want = np.concatenate([position_folds(p.name, pq.read_metadata(p).num_rows, 3, 7) for p in shards])
    else:
        want = value_folds(got[fold_by].to_numpy(), 3, 7)
    np.testing.assert_array_equal(got["te_fold"].to_numpy(), want)
    raw["fold"] = want
    for group in GROUPS:
        name = "te_" + "_".join(group)
        np.testing.assert_array_equal(got[name].to_numpy(), encode(raw, raw, group, "label", 4, training), err_msg=name)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_that_fits_gives_its_rows_out_of_fold_values(shards, tmp_path, workers) -> None:
    out = tmp_path / "out"
    preprocess(pipeline(), shards, out, workers=workers)
    check_against_reference(shards, output(out), training=True)
    assert json.loads((out / "manifest.json").read_text())["training"] is True


def test_a_dask_cluster_writes_the_threads_bytes(local_cluster, shards, tmp_path) -> None:
    preprocess(pipeline(), shards, tmp_path / "threads", workers=2)
    preprocess(pipeline(), shards, tmp_path / "dask", client=local_cluster, partitions=2)
    threads, dask = tree_bytes(tmp_path / "threads"), tree_bytes(tmp_path / "dask")
    assert {k: v for k, v in dask.items() if k != "manifest.json"} == {k: v for k, v in threads.items() if k != "manifest.json"}
    check_against_reference(shards, output(tmp_path / "dask"), training=True)
    p = Pipeline.load(tmp_path / "threads" / "artifacts")
    preprocess(p, shards, tmp_path / "dask-full", client=local_cluster)  # fitted: other rows, full statistics
    check_against_reference(shards, output(tmp_path / "dask-full"), training=False)


def test_fitted_artifacts_give_the_full_statistics_unless_told_and_a_rerun_that_changes_it_redoes_every_shard(shards, tmp_path) -> None:
    out = tmp_path / "out"
    preprocess(pipeline(), shards, out, workers=2)
    fitted = Pipeline.load(out / "artifacts")
    s = preprocess(fitted, shards, out, workers=2)
    assert s.files_skipped == 0 and read_manifest(out).training is False
    check_against_reference(shards, output(out), training=False)
    assert preprocess(fitted, shards, out, workers=2).files_skipped == 3
    s = preprocess(fitted, shards, out, workers=2, training=True)
    assert s.files_skipped == 0 and read_manifest(out).training is True
    check_against_reference(shards, output(out), training=True)
    preprocess(pipeline(), shards, tmp_path / "asked", training=False)  # a run that fits, told its rows are not training rows
    check_against_reference(shards, output(tmp_path / "asked"), training=False)


def test_a_pipeline_without_target_encoding_records_nothing(shards, tmp_path) -> None:
    p = Pipeline({"name": "plain", "ops": [{"op": "Decode", "columns": ["u", "i"]}, {"op": "Categorify", "columns": ["u", "i"]}]}, SCHEMA)
    assert not p.training_differs and pipeline().training_differs
    preprocess(p, shards, tmp_path / "out", training=True)
    assert "training" not in json.loads((tmp_path / "out" / "manifest.json").read_text())


def test_the_exchange_by_key_carries_training_rows_and_needs_fold_by(shards, tmp_path) -> None:
    history = {"op": "History", "columns": ["i"], "key": "u", "time": "t", "max_len": 3}
    with pytest.raises(ConfigError, match="TargetEncode .* input position, which History's exchange by key does not keep: give it fold_by"):
        preprocess(pipeline(history), shards, tmp_path / "no")
    preprocess(pipeline(history, fold_by="u"), shards, tmp_path / "out", workers=2)
    got = output(tmp_path / "out")
    assert len(got) == 2_400 and got["hist_len"].max() == 3
    check_against_reference(shards, got, training=True, fold_by="u")
    preprocess(Pipeline.load(tmp_path / "out" / "artifacts"), shards, tmp_path / "full", workers=2)
    check_against_reference(shards, output(tmp_path / "full"), training=False, fold_by="u")


@pytest.mark.parametrize("keyed", [False, True])
def test_a_split_run_encodes_train_out_of_fold_and_the_other_splits_with_the_train_statistics(shards: list[Path], tmp_path: Path,
                                                                                              keyed: bool) -> None:  # fmt: skip
    """Also through the exchange by key (History), whose train run comes with a pipeline fitted before it."""
    split = {"by": "time", "column": "t", "train_until": 600_000, "valid_until": 800_000}
    p = pipeline({"op": "History", "key": "u", "time": "t", "columns": ["i"], "max_len": 3}, fold_by="u") if keyed else pipeline()
    preprocess(p, shards, tmp_path / "out", split=split, workers=2)
    raw = raw_rows(shards)
    raw["fold"] = np.concatenate([position_folds(p.name, pq.read_metadata(p).num_rows, 3, 7) for p in shards])
    if keyed:
        raw["fold"] = value_folds(output(tmp_path / "out" / "train").set_index("rid")["u"].reindex(raw["rid"]).fillna(0).to_numpy(), 3, 7)
    parts = {role: output(tmp_path / "out" / role).set_index("rid") for role in ("train", "valid", "test")}
    train = parts["train"].assign(fold=raw.set_index("rid")["fold"], label=parts["train"]["label"].astype(np.float64))  # the reference sums float64
    assert sorted(train.index) == raw["rid"][raw["t"] < 600_000].tolist()
    np.testing.assert_array_equal(train["te_fold"].to_numpy(), train["fold"].to_numpy())
    assert [read_manifest(tmp_path / "out" / role).training for role in ("train", "valid", "test")] == [True, False, False]
    for group in GROUPS:  # the ids of every split come from train's vocabularies: the reference groups by them
        name = "te_" + "_".join(group)
        np.testing.assert_array_equal(train[name].to_numpy(), encode(train, train, group, "label", 4, True), err_msg=name)
        for role in ("valid", "test"):
            got = parts[role]
            assert len(got) and (got["t"] >= 600_000).all()
            np.testing.assert_array_equal(got[name].to_numpy(), encode(got, train, group, "label", 4, False), err_msg=f"{role} {name}")


def test_a_split_run_takes_no_training_flag(shards: list[Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="takes no --training/--no-training"):
        preprocess(pipeline(), shards, tmp_path / "out", split={"by": "time", "column": "t", "train_until": 600_000}, training=True)
