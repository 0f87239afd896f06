"""Shared test fixtures (paths of the repository and of the real data sets beside it, a shared Dask cluster and S3
server) and the suite's markers.

``slow`` is given by place, not by hand: every test under ``tests/integration/`` and ``tests/faults/`` (subprocesses,
kills, real data), and every test that uses the shared Dask cluster or S3 server. ``pytest -m "not slow"`` is the
inner loop (unit and contract tests). Under pytest-xdist (``-n N --dist loadgroup``), the tests of the shared
cluster run in one worker and those of the S3 server in one worker, so each starts once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pytest

if TYPE_CHECKING:
    from distributed import Client

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ETL_SHARED_DATA", REPO.parent / "shared" / "data"))
CRITEO_8K = DATA / "criteo-kaggle-8k"
MOVIELENS = DATA / "movielens-ml-latest-small"
DEEPCTR = DATA / "deepctr-samples"
MOVIELENS_SAMPLE = DEEPCTR / "movielens_sample.txt"


#: Test directories whose every test is ``slow``.
SLOW_DIRS = ("integration", "faults")
#: Session fixtures shared by many tests: each group runs in one xdist worker (and its tests are ``slow``).
SHARED_SERVICES = {"local_cluster": "dask", "s3_server": "s3"}


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal delivers it, however the suite was started: a process started in the background by a
    non-interactive shell (``pytest ... &`` in a script, some CI runners) inherits SIGINT ignored, as would every
    ``etl`` process it starts, while the tests that send SIGINT check what a foreground program does with it (a
    KeyboardInterrupt, exit status 130)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = REPO / "tests"
    for item in items:
        place = item.path.resolve().relative_to(tests).parts
        services = [group for name, group in SHARED_SERVICES.items() if name in getattr(item, "fixturenames", ())]
        if place[0] in SLOW_DIRS or services:
            item.add_marker(pytest.mark.slow)
        if services:
            item.add_marker(pytest.mark.xdist_group(services[0]))


def run_etl(*args: str, check: bool = True, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run the ``etl`` command as a user would, in a subprocess."""
    proc = subprocess.run([sys.executable, "-m", "etl", *map(str, args)], cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"etl {' '.join(map(str, args))} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def criteo_8k() -> Path:
    if not (CRITEO_8K / "train.csv").is_file():
        pytest.skip(f"real Criteo sample not found at {CRITEO_8K}")
    return CRITEO_8K


@pytest.fixture(scope="session")
def criteo_8k_shards(criteo_8k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Criteo sample as `etl convert` writes it from its three files named in the order train, dev, test
    (3,000 rows a shard: 3,000, 3,000, 2,000); read-only for the tests that share it."""
    out = tmp_path_factory.mktemp("criteo-8k") / "raw"
    run_etl("convert", *(criteo_8k / f for f in ("train.csv", "dev.csv", "test.csv")), "--schema", REPO / "schemas/criteo.yaml",
            "--out", out, "--rows-per-file", 3000)  # fmt: skip
    return out


@pytest.fixture(scope="session")
def criteo_8k_glob_shards(criteo_8k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Criteo sample as `etl convert` writes it from a quoted glob pattern (expanded by etl, in name
    order: dev, test, train), 3,000 rows a shard; read-only for the tests that share it."""
    out = tmp_path_factory.mktemp("criteo-8k-glob") / "raw"
    run_etl("convert", f"{criteo_8k}/*.csv", "--schema", REPO / "schemas/criteo.yaml", "--out", out, "--rows-per-file", 3000)
    return out


@pytest.fixture(scope="session")
def movielens() -> Path:
    if not (MOVIELENS / "ratings.csv").is_file():
        pytest.skip(f"MovieLens sample not found at {MOVIELENS}")
    return MOVIELENS


@pytest.fixture(scope="session")
def deepctr() -> Path:
    if not all((DEEPCTR / f"{name}_sample.txt").is_file() for name in ("criteo", "avazu", "movielens")):
        pytest.skip(f"DeepCTR samples not found at {DEEPCTR}")
    return DEEPCTR


@pytest.fixture(scope="session")
def movielens_sample() -> Path:
    """DeepCTR's MovieLens-1M sample: 200 joined rows (CSV with header)."""
    if not MOVIELENS_SAMPLE.is_file():
        pytest.skip(f"MovieLens sample not found at {MOVIELENS_SAMPLE}")
    return MOVIELENS_SAMPLE


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (recursively) by its path relative to ``root``, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def criteo_table(n: int, seed: int = 0) -> pa.Table:
    """``n`` raw Criteo-layout rows: 0/1 labels, dense values in [-3, 1000) and 8-digit hex keys from 50 per column,
    with missing values."""
    rng = np.random.default_rng(seed)
    cols: dict[str, pa.Array] = {"label": pa.array(rng.integers(0, 2, n))}
    for i in range(1, 14):
        v = rng.integers(-3, 1000, n)
        cols[f"I{i}"] = pa.array(v, mask=rng.random(n) < 0.2)
    for i in range(1, 27):
        keys = rng.integers(0, 50, n)
        cols[f"C{i}"] = pa.array([f"{k * 2654435761 % 2**32:08x}" for k in keys], pa.string(), mask=rng.random(n) < 0.1)
    return pa.table(cols)


def criteo_shards(directory: Path, bad_first_c1: bool = True) -> tuple[list[Path], pa.Table]:
    """Two raw Criteo shards of 200 rows written to ``directory`` (made here), ``part-00000.parquet`` and
    ``part-00001.parquet``: the second has a malformed C1 in its first row (quarantined, or the run's row error)
    when ``bad_first_c1``. Returns their paths and the first shard's table."""
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    table = criteo_table(200, seed=4)
    pq.write_table(table, directory / "part-00000.parquet")
    second = table
    if bad_first_c1:
        second = table.set_column(table.schema.get_field_index("C1"), "C1", pa.array(["zz"] + table["C1"].to_pylist()[1:], pa.string()))
    pq.write_table(second, directory / "part-00001.parquet")
    return sorted(directory.iterdir()), table


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[Client | None]:
    """A Dask cluster of two worker processes (``etl.runtime.cluster.connect("local:2")``) for the whole session: its
    client. Shared by the tests that only run work on such a cluster, so that it starts once; a test that kills
    workers or changes Dask's configuration starts a cluster of its own."""
    pytest.importorskip("distributed")
    from etl.runtime.cluster import connect

    with connect("local:2") as client:
        yield client


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A real S3 API (moto in server mode) on a free local port, for the whole session: its endpoint URL."""
    server_module = pytest.importorskip("moto.server")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty bucket on the ``s3_server``, reachable the standard way (``AWS_ENDPOINT_URL`` and dummy
    credentials in the environment, inherited by ``run_etl`` subprocesses): its ``s3://`` URL."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    import boto3

    bucket = f"etl-test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    return f"s3://{bucket}"


def etl_threads() -> set[threading.Thread]:
    """The package's threads (named ``etl-...``) alive now."""
    return {t for t in threading.enumerate() if t.name.startswith("etl-")}


def new_threads(before: set[threading.Thread], allow: int = 0, timeout: float = 60.0) -> list[threading.Thread]:
    """The ``etl-`` threads not in ``before`` still alive once at most ``allow`` of them are, or ``timeout`` seconds
    passed (pool threads exit asynchronously after ``shutdown(wait=False)``, once what they are doing ends: on a
    busy machine, seconds). ``new_threads(set())`` waits for every one of them."""
    deadline = time.monotonic() + timeout
    while len(left := etl_threads() - before) > allow and time.monotonic() < deadline:
        time.sleep(0.02)
    return sorted(left, key=lambda t: t.name)


def stacks(threads: list[threading.Thread]) -> str:
    """Each thread's name and where it is now: what a test that finds threads left over reports."""
    frames = sys._current_frames()
    return "\n".join(f"{t.name}:\n{''.join(traceback.format_stack(frames[t.ident]))}" for t in threads if t.ident in frames)


def pipeline_with_stages(pipeline: Path, stages: list[dict], path: Path) -> Path:
    """A copy of the pipeline file ``pipeline`` with ``stages`` (its schema path made absolute), written to
    ``path``."""
    import yaml

    doc = yaml.safe_load(pipeline.read_text())
    doc["schema"] = str((pipeline.parent / doc["schema"]).resolve())
    doc["stages"] = stages
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def filtered_copies(shards: list[Path], keep, out: Path) -> list[Path]:
    """Each of ``shards`` rewritten into ``out`` (same names) with the rows for which ``keep(table)`` (an Arrow
    boolean array; null: not kept) is true, row group by row group (each keeps its size, less the rows left out)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard in shards:
        f = pq.ParquetFile(shard)
        tables = [f.read_row_group(i) for i in range(f.num_row_groups)]
        with pq.ParquetWriter(out / shard.name, f.schema_arrow) as w:
            for t in tables:
                w.write_table(t.filter(pc.fill_null(keep(t), False)))
        paths.append(out / shard.name)
    return paths


def spy_reads(monkeypatch: pytest.MonkeyPatch) -> list[list[str] | None]:
    """The columns of every ``Shard.read_table`` call from now on (None: the whole row group), in call order."""
    from etl.io.parquet import Shard

    reads: list[list[str] | None] = []
    read_table = Shard.read_table

    def spy(self: Shard, i: int, columns: list[str] | None = None) -> pa.Table:
        reads.append(columns)
        return read_table(self, i, columns)

    monkeypatch.setattr(Shard, "read_table", spy)
    return reads
