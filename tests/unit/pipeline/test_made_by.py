"""etl.pipeline.made_by: a table's record of what made it, kept in its Parquet schema metadata beside the table's
own metadata, and the check naming what differs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import ArtifactError
from etl.ops.base import made_by
from etl.pipeline.made_by import MADE_BY, check_record, stamped, table_record

RECORD = made_by("Categorify", "C3", {"freq_threshold": 2, "max_size": None, "oov_buckets": 1})


def error(problem: str) -> ArtifactError:
    return ArtifactError(f"t.parquet: {problem}")


def test_a_record_survives_parquet_beside_the_tables_own_metadata(tmp_path: Path) -> None:
    table = pa.table({"key": pa.array([1, 2], pa.uint64())}).replace_schema_metadata({"nulls": "3"})
    pq.write_table(stamped(table, RECORD), tmp_path / "t.parquet")
    read = pq.read_table(tmp_path / "t.parquet")
    assert read.schema.metadata[b"nulls"] == b"3" and table_record(read) == RECORD
    check_record(table_record(read), RECORD, error)


def test_a_table_without_a_record_has_none_and_one_of_no_json_has_its_bytes() -> None:
    table = pa.table({"key": [1]})
    assert table_record(table) is None
    assert table_record(table.replace_schema_metadata({MADE_BY: b"{oops"})) == b"{oops"


@pytest.mark.parametrize(
    ("saved", "message"),
    [
        (made_by("Categorify", "C4", RECORD["params"]), r"made by another pipeline: column 'C4' \(this pipeline: 'C3'\)$"),
        (made_by("Hash", "C3", RECORD["params"] | {"oov_buckets": 4}),
         r"made by another pipeline: oov_buckets 4 \(this pipeline: 1\), op 'Hash' \(this pipeline: 'Categorify'\)$"),
        (made_by("Categorify", "C3", {"freq_threshold": 2, "oov_buckets": 1}), r"made by another pipeline: max_size <none> \(this pipeline: None\)$"),
        (RECORD | {"made": "elsewhere"}, r"made by another pipeline: record \{.*'made': 'elsewhere'\}$"),
        (None, r"no valid record of what made it \(made_by None\)"),
        (b"{oops", r"no valid record"),
        ({"op": "Categorify", "column": "C3", "params": 3}, "no valid record"),
    ],
)
def test_another_record_is_refused_naming_what_differs(saved: object, message: str) -> None:
    with pytest.raises(ArtifactError, match=r"^t\.parquet: " + message):
        check_record(saved, RECORD, error)
