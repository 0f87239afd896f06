"""scripts/produce_shards.py as a producer runs it: traced shards renamed into place and, with --manifest, listed in
the producer manifest; started again, it continues after the last shard and first lists the ones an interrupted run
renamed but did not list."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from etl.io.arrivals_manifest import read_arrivals, write_arrivals
from tests.conftest import REPO


def produce(out: Path, shards: int, *extra: str) -> None:
    """Run the script (in this process: its imports are the test's) with these arguments."""
    argv = ["produce_shards.py", "--out", str(out), "--shards", str(shards), "--shard-rows", "20", "--rate", "1000", *extra]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sys, "argv", argv)
        runpy.run_path(str(REPO / "scripts/produce_shards.py"), run_name="__main__")


def test_manifest_lists_every_shard_in_order_across_an_interrupted_run(tmp_path: Path) -> None:
    out = tmp_path / "stream"
    produce(out, 2, "--manifest")
    names = ["part-000000.parquet", "part-000001.parquet"]
    assert read_arrivals(out) == names and sorted(p.name for p in out.glob("*.parquet")) == names
    write_arrivals(out, names[:1])  # killed after renaming part-000001 and before listing it
    produce(out, 1, "--manifest")
    assert read_arrivals(out) == [*names, "part-000002.parquet"]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
