"""TargetEncode in a pipeline: out-of-fold encodings of training rows and full-statistics encodings of other rows
agree exactly with an independent pandas reference (folds recomputed from the documented hashes), for a 0/1 label
and a dense target with missing values, with and without fold_by, on 1 and 2 fitting threads; folds and
statistics do not depend on how the input is cut; serving needs no target and gives unseen categories the prior;
artifacts hold no pickle and a tampered one is refused naming its file; bad parameters and targets are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import ArtifactError, RowError, SpecError
from etl.io.parquet import open_shard
from etl.pipeline import Pipeline
from etl.schema import parse_schema
from tests.conftest import tree_bytes
from tests.unit.ops.target_reference import encode, position_folds, value_folds

COLUMNS = [
    {"name": "label", "role": "label", "dtype": "int64"},
    {"name": "u", "role": "categorical", "dtype": "int64", "encoding": "int"},
    {"name": "i", "role": "categorical", "dtype": "string", "encoding": "string"},
    {"name": "r", "role": "dense", "dtype": "float64"},
]
SCHEMA = parse_schema({"name": "events", "columns": COLUMNS})
GROUPS = [["i"], ["u", "i"]]  # in a pipeline file: [i, [u, i]]; a list of one name is that column


def events(n: int, seed: int) -> pa.Table:
    """Events of 60 users and 40 items: a 0/1 label, and a rating ``r`` in halves, missing one time in ten."""
    rng = np.random.default_rng(seed)
    r = rng.integers(1, 11, n) / 2
    return pa.table({"label": rng.integers(0, 2, n), "u": rng.integers(0, 60, n) * 7919 - 100, "i": [f"item-{k}" for k in rng.integers(0, 40, n)],
                     "r": pa.array(r, mask=rng.random(n) < 0.1)})  # fmt: skip


def write_shards(directory: Path, table: pa.Table, cuts: list[int], row_group: int) -> list[Path]:
    directory.mkdir(parents=True)
    paths = []
    for k, (a, b) in enumerate(zip([0, *cuts], [*cuts, table.num_rows])):
        paths.append(directory / f"part-{k}.parquet")
        pq.write_table(table.slice(a, b - a), paths[-1], row_group_size=row_group)
    return paths


def pipeline(target: str = "label", **params) -> Pipeline:
    te = {"op": "TargetEncode", "columns": GROUPS, "target": target, "kfold": 4, "seed": 42, "smoothing": 7.5, "export_fold": True} | params
    return Pipeline({"ops": [{"op": "Decode", "columns": ["u", "i"]}, {"op": "Categorify", "columns": ["u", "i"]}, te]}, SCHEMA)


def transformed(p: Pipeline, paths: list[Path], training: bool) -> pd.DataFrame:
    """Every row of the shards, transformed, in input order."""
    tables = []
    for path in paths:
        shard = open_shard(path, p.schema)
        tables += [p.to_arrow(p.transform(shard.read(g), training=training).batch) for g in range(shard.num_row_groups)]
    return pa.concat_tables(tables).to_pandas()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[pa.Table, list[Path]]:
    table = events(3_000, 1)
    return table, write_shards(tmp_path_factory.mktemp("te") / "raw", table, [1_700], 500)


@pytest.mark.parametrize("fold_by", [None, "u"])
@pytest.mark.parametrize("target", ["label", "r"])
@pytest.mark.parametrize("workers", [1, 2])
def test_encodings_agree_with_the_reference(data, fold_by, target, workers) -> None:
    table, paths = data
    p = pipeline(target, fold_by=fold_by)
    p.fit(paths, workers=workers)
    train, other = transformed(p, paths, training=True), transformed(p, paths, training=False)
    raw = table.to_pandas()
    if fold_by is None:
        want = np.concatenate([position_folds(path.name, pq.read_metadata(path).num_rows, 4, 42) for path in paths])
    else:
        want = value_folds(train["u"].to_numpy(), 4, 42)  # the fold of the user's id, as TargetEncode sees it
    np.testing.assert_array_equal(train["te_fold"].to_numpy(), want)
    np.testing.assert_array_equal(other["te_fold"].to_numpy(), want)
    assert 0.15 < np.bincount(want).min() / len(want)  # the folds are about even
    raw["fold"] = train["te_fold"].to_numpy()
    for group in GROUPS:
        name = "te_" + "_".join(group)
        np.testing.assert_array_equal(train[name].to_numpy(), encode(raw, raw, group, target, 7.5, training=True), err_msg=name)
        np.testing.assert_array_equal(other[name].to_numpy(), encode(raw, raw, group, target, 7.5, training=False), err_msg=name)
        assert train[name].dtype == np.float32
    assert not np.array_equal(train["te_i"].to_numpy(), other["te_i"].to_numpy())


def test_folds_and_statistics_do_not_depend_on_how_the_input_is_cut(tmp_path) -> None:
    table = events(2_000, 2)
    by_user = []
    for k, (cuts, row_group) in enumerate([([900], 300), ([400, 1_300, 1_301], 77)]):
        p = pipeline(fold_by="u")
        p.fit(write_shards(tmp_path / f"cut{k}", table, cuts, row_group), workers=2)
        p.save(tmp_path / f"art{k}")
        by_user.append({k: v for k, v in tree_bytes(tmp_path / f"art{k}").items() if "TargetEncode" in k})
    assert by_user[0] == by_user[1] and len(by_user[0]) == 2
    outs = []
    for k, row_group in enumerate([1_000, 33]):  # the same files, in other row groups: the same position folds
        paths = write_shards(tmp_path / f"groups{k}", table, [1_200], row_group)
        p = pipeline()
        p.fit(paths, workers=2)
        outs.append(transformed(p, paths, training=True))
    pd.testing.assert_frame_equal(outs[0], outs[1])


def test_serving_needs_no_target_and_gives_unseen_categories_the_prior(data) -> None:
    table, paths = data
    p = pipeline()
    p.fit(paths)
    out = p.transform_table({"u": [-100, 5, None], "i": ["item-3", "never seen", "item-3"], "r": [1.0, None, 2.5]})
    assert out.column_names == ["u", "i", "r", "te_i", "te_u_i", "te_fold"]
    prior = np.float32(pc_mean(table["label"]))
    te_i = out["te_i"].to_pylist()
    assert te_i[1] == prior and te_i[0] == te_i[2] != prior
    assert out["te_u_i"].to_pylist()[1:] == [prior, prior]  # user 5 and a missing user: crosses never seen


def pc_mean(column: pa.ChunkedArray) -> float:
    values = column.to_numpy()
    return float(values.sum()) / len(values)


def test_artifacts_are_json_and_parquet_and_a_tampered_one_is_refused_naming_its_file(data, tmp_path) -> None:
    _, paths = data
    p = pipeline(fold_by="u")
    p.fit(paths)
    art = tmp_path / "art"
    p.save(art)
    assert sorted(f.suffix for f in art.rglob("*") if f.is_file()) == [".json"] + [".parquet"] * 4
    batch = open_shard(paths[0], SCHEMA).read(0)
    loaded = Pipeline.load(art)
    for training in (False, True):
        assert loaded.to_arrow(loaded.transform(batch, training=training).batch).equals(p.to_arrow(p.transform(batch, training=training).batch))

    table_path = art / "02-TargetEncode" / "te_i.parquet"
    original = pq.read_table(table_path)
    counts = original["count"].to_pylist()
    counts[3] += 1
    tampered = original.set_column(2, "count", pa.array(counts, pa.int64())).replace_schema_metadata(original.schema.metadata)
    pq.write_table(tampered, table_path)
    with pytest.raises(ArtifactError, match=rf"^{table_path}: .*te_i.*do not add up to the fold's totals"):
        Pipeline.load(art)
    keys = original["key"].to_pylist()
    keys[0], keys[-1] = keys[-1], keys[0]
    pq.write_table(original.set_column(0, "key", pa.array(keys, pa.uint64())).replace_schema_metadata(original.schema.metadata), table_path)
    with pytest.raises(ArtifactError, match=rf"^{table_path}: .*ordered by key then fold"):
        Pipeline.load(art)
    pq.write_table(original, table_path)
    Pipeline.load(art)

    manifest = art / "pipeline.json"
    doc = json.loads(manifest.read_text())
    doc["ops"][2]["state"]["folds"]["te_u_i"]["sum"][0] += 2.0**-21
    manifest.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match=rf"^{manifest}: .*te_u_i.*multiple of 2\*\*-20"):
        Pipeline.load(art)
    doc["ops"][2]["state"]["folds"]["te_u_i"]["sum"][0] -= 2.0**-21
    tables = doc["ops"][2]["tables"]
    tables["te_i"], tables["te_u_i"] = tables["te_u_i"], tables["te_i"]
    manifest.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match=r"te_u_i\.parquet: table of ops\[2\] \(TargetEncode\) 'te_i': made by another pipeline: column 'te_u_i'"):
        Pipeline.load(art)


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"kfold": 1}, r"kfold must be an integer in \[2, 100\]"),
        ({"smoothing": -1}, "smoothing must be a finite number >= 0"),
        ({"columns": [[]]}, "expected a column name or a list of names"),
        ({"columns": [["u", "u"]]}, r"columns\[0\]': column 'u' is selected more than once"),
        ({"columns": ["i", "i"]}, "two of its inputs write column 'te_i'"),
        ({"target": "u"}, "the target is a label or dense column"),
        ({"target": "nope"}, "no schema column named 'nope'"),
        ({"target": None}, "target must name the column of the target"),
        ({"fold_by": "r"}, "column 'r' holds number values, the op needs ids"),
        ({"export_fold": "yes"}, "export_fold must be true or false"),
        ({"prefix": "a/b"}, "prefix must be a non-empty text"),
        ({"columns": ["fold"], "export_fold": True, "prefix": "x"}, "two of its inputs write column 'xfold'"),
    ],
)
def test_bad_parameters_are_refused(params, problem) -> None:
    te = {"op": "TargetEncode", "columns": ["i"], "target": "label"} | params
    schema = parse_schema({"name": "s", "columns": [*COLUMNS, {"name": "fold", "role": "categorical", "dtype": "int64", "encoding": "int"}]})
    ops = [{"op": "Decode", "columns": ["u", "i", "fold"]}, {"op": "Categorify", "columns": ["u", "i", "fold"]}, te]
    with pytest.raises(SpecError, match=problem):
        Pipeline({"ops": ops}, schema)


def test_raw_values_and_lists_are_refused() -> None:
    with pytest.raises(SpecError, match="column 'i' holds raw values, the op needs ids"):
        Pipeline({"ops": [{"op": "Decode", "columns": ["u"]}, {"op": "Categorify", "columns": ["u"]},
                          {"op": "TargetEncode", "columns": ["i"], "target": "label"}]}, SCHEMA)  # fmt: skip
    genres = {"name": "g", "role": "list", "dtype": "string", "encoding": "string", "separator": "|"}
    schema = parse_schema({"name": "s", "columns": [{"name": "label", "role": "label", "dtype": "int64"}, genres]})
    with pytest.raises(SpecError, match="column 'g' is a list column"):
        Pipeline({"ops": [{"op": "Decode", "columns": ["g"]}, {"op": "Categorify", "columns": ["g"]},
                          {"op": "TargetEncode", "columns": ["g"], "target": "label"}]}, schema)  # fmt: skip


def test_a_nan_target_is_a_row_error_at_fit_and_transform(tmp_path) -> None:
    table = events(200, 3)
    r = table["r"].to_numpy(zero_copy_only=False).copy()
    r[57] = np.nan
    table = table.set_column(3, "r", pa.array(r, mask=np.isnan(r) & (np.arange(200) != 57)))
    paths = write_shards(tmp_path / "raw", table, [], 100)
    p = pipeline("r")
    with pytest.raises(RowError, match=r"row 57, column 'r': target is NaN, infinite or beyond ±2\*\*31"):
        p.fit(paths)
    p.fit(paths, on_error="quarantine")
    t = p.transform(open_shard(paths[0], SCHEMA).read(0), on_error="quarantine", training=True)
    assert [r.rows.tolist() for r in t.rejected] == [[57]] and t.batch.num_rows == 99
