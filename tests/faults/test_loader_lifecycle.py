"""Loader lifecycle faults: leaving a pass with ``break`` at any batch, dropping loaders without ``close()``, the
data-wait share over several passes, and a processed output checked before its rows are used. The lifecycle cases
run in a subprocess with a timeout, so a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl import Loader
from etl.errors import InputError
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, run_etl

HASH = REPO / "pipelines/criteo_hash.yaml"


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lifecycle") / "raw"
    generate(load_schema(REPO / "schemas/criteo.yaml"), 6_000, 3, out, seed=3)
    return out


def run(code: str, timeout: float = 90) -> str:
    """Run ``code`` in a fresh interpreter from the repository; its stdout (a timeout is a hang: the test fails)."""
    try:
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {timeout} s")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("shuffle, workers", [(False, 2), (True, 2), (True, 0)])
def test_break_at_every_batch_then_next_epoch(raw: Path, shuffle: bool, workers: int) -> None:
    out = run(f"""
        import etl
        loader = etl.Loader({str(raw)!r}, pipeline={str(HASH)!r}, batch_size=512, num_workers={workers}, prefetch=2,
                            shuffle={shuffle}, shuffle_buffer=1024)
        n = len(loader)
        full = [b.sparse.clone() for b in loader]
        for k in range(n):
            loader.set_epoch(2 * k + 1)
            for i, b in enumerate(loader):
                if i == k:
                    break
            loader.set_epoch(2 * k + 2)
            batches = [b.sparse.clone() for b in loader]
            assert len(batches) == n, (k, len(batches), n)
        loader.close()
        print("ok", n)
    """)
    assert out.startswith("ok 12")


def test_break_with_a_live_iterator_then_next_epoch(raw: Path) -> None:
    """The abandoned pass is still referenced (not collected) when the next epoch starts."""
    run(f"""
        import etl
        loader = etl.Loader({str(raw)!r}, pipeline={str(HASH)!r}, batch_size=512, num_workers=2, prefetch=2)
        for k in (0, 5, 11):
            it = iter(loader)
            for _ in range(k + 1):
                next(it)
            loader.set_epoch(k + 1)
            assert sum(1 for _ in loader) == len(loader)
            del it
        loader.close()
    """)


def test_dropped_loaders_free_their_threads(raw: Path) -> None:
    out = run(f"""
        import gc, threading, time
        import etl
        base = threading.active_count()
        for i in range(100):
            loader = etl.Loader({str(raw)!r}, pipeline={str(HASH)!r}, batch_size=2048, num_workers=2)
            it = iter(loader)
            next(it)
            if i % 2:
                for _ in it:  # a full epoch: the next epoch's pass starts in the background
                    pass
            del it, loader
        gc.collect()
        deadline = time.time() + 10
        while threading.active_count() > base and time.time() < deadline:
            time.sleep(0.05)
        print(base, threading.active_count())
    """, timeout=180)
    base, after = map(int, out.split())
    assert after == base


def test_data_wait_fraction_stays_a_share_over_passes(raw: Path) -> None:
    out = run(f"""
        import time
        import etl
        loader = etl.Loader({str(raw)!r}, pipeline={str(HASH)!r}, batch_size=512, num_workers=1, prefetch=1)
        for epoch in range(3):
            loader.set_epoch(epoch)
            for i, b in enumerate(loader):
                if epoch == 1 and i == 2:
                    break
                time.sleep(0.002)
        s = loader.stats
        loader.close()
        print(s.wait_seconds, s.consumer_seconds, s.data_wait_fraction)
    """)
    wait, consumer, fraction = map(float, out.split())
    assert 0 < consumer and 0 <= wait <= consumer and 0 <= fraction <= 1


def test_processed_output_is_checked_before_use(raw: Path, tmp_path: Path) -> None:
    """An incomplete run is refused unless allow_partial; a part whose bytes changed is refused when read."""
    out = tmp_path / "out"
    run_etl("preprocess", "--pipeline", HASH, "--input", raw, "--out", out, "--workers", "1")
    assert sum(len(b) for b in Loader(out, batch_size=1000)) == 6_000
    manifest = json.loads((out / "manifest.json").read_text())
    partial = dict(manifest, complete=False, files=manifest["files"][:1])
    partial["totals"] = {k: manifest["files"][0][k] for k in manifest["totals"]}
    (out / "manifest.json").write_text(json.dumps(partial))
    with pytest.raises(InputError, match="incomplete"):
        Loader(out, batch_size=1000)
    assert sum(len(b) for b in Loader(out, batch_size=1000, allow_partial=True)) == manifest["files"][0]["rows_out"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    part = out / manifest["files"][1]["output"]
    table = pq.read_table(part)
    pq.write_table(table, part, compression="snappy")  # the same rows in other bytes
    with pytest.raises(InputError, match="sha256"):
        sum(len(b) for b in Loader(out, batch_size=1000))


def test_without_workers_a_bad_value_is_raised_by_next_itself(raw: Path, tmp_path: Path) -> None:
    """With ``num_workers=0`` the row error comes from ``next()`` itself, as it is (no LoaderError wrapping), after
    the batches before the bad row; iterating again resumes at the failed batch and fails there again."""
    from etl.errors import RowError

    bad = tmp_path / "bad"
    bad.mkdir()
    table = pq.read_table(sorted(raw.glob("*.parquet"))[0])
    c3 = table.column("C3").to_pylist()
    c3[1500] = "zz123456"
    fixed = table.set_column(table.schema.get_field_index("C3"), "C3", pa.array(c3, pa.string()))
    pq.write_table(fixed, bad / "part-00000.parquet", row_group_size=500)
    loader = Loader(bad, pipeline=HASH, batch_size=500, shuffle_buffer=500, num_workers=0)
    for expected_rows in (1500, 0):
        got = 0
        with pytest.raises(RowError, match=r"part-00000.parquet, row group 3, row 1500, column 'C3': malformed value"):
            for b in loader:
                got += len(b)
        assert got == expected_rows and loader.position == 3
