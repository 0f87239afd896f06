"""etl preprocess with a split on a Dask cluster (--cluster local:2): every split's files, artifacts and report are
the bytes of the threaded run, whose rows and vocabularies tests/unit/preprocess/test_split.py checks against plain
Python; with History too (the exchange through Dask's shuffle, the output routed to the splits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from tests.unit.preprocess.test_split import HISTORY, OPS, TIME, events, output, role_of, tree, write


def same_as_threads(tmp: Path, client: object, split: dict[str, Any], ops: list[dict[str, Any]] | None = None) -> None:
    table = events(1200, seed=11)
    _, shards = write(tmp, table, [500, 900], ops=ops)
    runs = [preprocess(Pipeline.from_file(tmp / "p.yaml"), shards, tmp / name, split=split, **kwargs)  # type: ignore[arg-type]
            for name, kwargs in (("threads", {"workers": 2}), ("dask", {"client": client}))]  # fmt: skip
    assert [p.report for p in runs[0].splits] == [p.report for p in runs[1].splits]
    for role in [p.role for p in runs[0].splits]:
        a, b = tmp / "threads" / role, tmp / "dask" / role
        assert tree(a) == tree(b)  # outputs, quarantine, artifacts and manifest
    if split["by"] == "time":
        assert output(tmp / "dask" / "valid")["eid"].to_pylist() == [r["eid"] for r in table.to_pylist() if role_of(r, TIME) == "valid"]


def test_a_time_split_on_a_cluster_gives_the_bytes_of_threads(tmp_path: Path, local_cluster: object) -> None:
    same_as_threads(tmp_path, local_cluster, TIME)


@pytest.mark.parametrize("split", [{"by": "last", "key": "user", "time": "ts", "tiebreak": ["tb"], "valid": 1, "test": 1}], ids=["last"])
def test_history_with_a_split_on_a_cluster_gives_the_bytes_of_threads(tmp_path: Path, local_cluster: object, split: dict[str, Any]) -> None:
    same_as_threads(tmp_path, local_cluster, split, ops=[*OPS[:2], HISTORY, OPS[2]])
