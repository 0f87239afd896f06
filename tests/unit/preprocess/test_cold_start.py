"""Values unseen in train (etl.preprocess.cold_start): counted as Categorify sees them (after FirstX), against the
vocabulary (a value train holds fewer than freq_threshold times is unseen too), rows rejected before Categorify
left out, missing values never counted, a list row counted once."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from etl.io.processed import Unseen
from etl.pipeline import Pipeline
from etl.pipeline.split_rows import SplitStage, TimeRoles
from etl.preprocess.cold_start import unseen_in_train
from etl.schema import load_schema

SCHEMA = {
    "name": "s",
    "columns": [
        {"name": "label", "role": "label", "dtype": "int64"},
        {"name": "user", "role": "categorical", "dtype": "string"},
        {"name": "tags", "role": "list", "dtype": "string", "separator": "|"},
        {"name": "ts", "role": "passthrough", "dtype": "int64"},
    ],
}


def test_unseen_values_against_the_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SCHEMA))
    ops = [{"op": "Decode", "columns": ["user", "tags"]}, {"op": "FirstX", "columns": ["tags"], "x": 2},
           {"op": "Categorify", "columns": ["user", "tags"], "freq_threshold": 2}]  # fmt: skip
    pipeline = Pipeline({"name": "p", "schema": "s.yaml", "ops": ops}, load_schema(tmp_path / "s.yaml"), "p.yaml")
    train = [("a", ["x"]), ("a", ["x", "y"]), ("b", ["y"]), ("b", []), ("c", ["z"])]  # c and z once: below freq_threshold
    later = [("a", ["x", "w"]), ("c", ["q", "q", "v"]), (None, None), ("d", ["x"]), ("e", ["y"]), ("d", [])]
    labels = [1] * 5 + [1, 1, 1, 1, None, 1]  # the row of e has no label: rejected by the label check
    users, tags = zip(*train, *later)
    table = pa.table({"label": pa.array(labels, pa.int64()), "user": pa.array(users), "tags": pa.array(tags, pa.list_(pa.string())),
                      "ts": pa.array([0] * 5 + [1] * 6, pa.int64())})  # fmt: skip
    pq.write_table(table, tmp_path / "raw.parquet", row_group_size=4)
    roles = TimeRoles(pipeline.schema, "ts", 1, None)
    pipeline.with_stages([SplitStage(roles, "train", {str(tmp_path / "raw.parquet"): 0})]).fit([tmp_path / "raw.parquet"])
    got = unseen_in_train(pipeline, roles, "test", [tmp_path / "raw.parquet"], 2)
    # user: c (below the threshold) and d, twice: 3 rows, 2 values; tags (the first 2): w, q (twice in one row): 2 rows, 2 values
    assert got == (Unseen("user", 3, 2), Unseen("tags", 2, 2))
    assert unseen_in_train(pipeline, roles, "train", [tmp_path / "raw.parquet"], 1) == (Unseen("user", 1, 1), Unseen("tags", 1, 1))
