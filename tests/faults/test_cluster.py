"""Faults of ``preprocess`` on a Dask cluster: a worker process killed with SIGKILL mid-run (Dask runs its task
again; the output is byte-identical to a threaded run, no row lost or duplicated, no temporary left), Ctrl-C of
``etl preprocess --cluster local:2`` (the cluster it started stops: no process is left behind), and worker processes
killed while the cluster starts or again and again while it fits and transforms (one line, exit status 2); the
same for the exchange by key of a History pipeline (the bytes of threads after one kill, one line after a storm)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from etl.io.files import is_temporary
from etl.io.parquet import list_shards
from etl.io.processed import read_manifest
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.runtime.cluster import connect
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, run_etl, tree_bytes

PIPELINE = REPO / "pipelines/criteo.yaml"
ROWS, FILES = 240_000, 8


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gen") / "raw"
    generate(load_schema(REPO / "schemas/criteo.yaml"), ROWS, FILES, d, seed=7)
    return d


@pytest.fixture(scope="module")
def reference(raw: Path, tmp_path_factory) -> Path:
    """A threaded run, fitted here; its artifacts serve the other runs."""
    out = tmp_path_factory.mktemp("ref") / "out"
    preprocess(Pipeline.from_file(PIPELINE), list_shards(raw), out, workers=2)
    return out


def test_a_worker_killed_mid_run_is_replaced_and_the_bytes_are_those_of_threads(raw: Path, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    started = threading.Event()
    rows_at_kill: list[int] = []
    rows = [0]

    def progress(name: str, n: int) -> None:
        rows[0] += n
        started.set()

    with connect("local:2") as client:
        failure: list[BaseException] = []

        def drive() -> None:
            try:
                preprocess(Pipeline.from_file(PIPELINE), list_shards(raw), out, artifacts=reference / "artifacts", client=client, progress=progress)
            except BaseException as e:  # noqa: BLE001 - re-raised by the test thread
                failure.append(e)

        driver = threading.Thread(target=drive)
        driver.start()
        assert started.wait(60), "no row was transformed"
        pids = client.run(os.getpid)
        busy = [addr for addr, keys in client.processing().items() if keys]
        assert busy, "no task was running at the kill; give it more data"
        rows_at_kill.append(rows[0])
        os.kill(pids[busy[0]], signal.SIGKILL)
        driver.join(120)
        assert not driver.is_alive() and not failure, failure
        assert set(client.run(os.getpid).values()) != set(pids.values())  # the killed worker was replaced
    assert rows_at_kill[0] < ROWS
    assert tree_bytes(out) == tree_bytes(reference)  # every part, quarantine and artifact file, and the manifest
    totals = read_manifest(out).totals
    assert (totals.rows_in, totals.rows_out, totals.rows_quarantined) == (ROWS, ROWS, 0)
    assert not [p for p in out.rglob("*") if is_temporary(p.name)]


def test_ctrl_c_stops_the_cluster_it_started(raw: Path, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "etl", "preprocess", "--pipeline", str(PIPELINE), "--input", str(raw), "--out", str(out)]
    cmd += ["--artifacts", str(reference / "artifacts"), "--cluster", "local:2"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:  # until a task writes
            if out.is_dir() and any(is_temporary(p.name) for p in out.iterdir()):
                break
            time.sleep(0.005)
        assert proc.poll() is None, "preprocess ended before Ctrl-C; give it more data"
        started = psutil.Process(proc.pid).children(recursive=True)
        assert len(started) >= 2  # the worker processes (and their nannies)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert "Traceback" not in stderr, stderr
    gone, alive = psutil.wait_procs(started, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    assert not (out / ".etl.lock").exists()
    run_etl("preprocess", "--pipeline", PIPELINE, "--input", raw, "--out", out, "--artifacts", reference / "artifacts")  # resumed in threads
    assert tree_bytes(out) == tree_bytes(reference)


def _worker_processes(parent: psutil.Process) -> list[psutil.Process]:
    """The Dask worker processes under ``parent`` (started by multiprocessing's spawn; its resource tracker aside)."""
    found = []
    for p in parent.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "spawn_main" in " ".join(p.cmdline()):
                found.append(p)
    return found


def _preprocess_killing_workers(raw: Path, out: Path, every: float, artifacts: Path | None = None, once_working: bool = False,
                                pipeline: Path = PIPELINE) -> subprocess.CompletedProcess:  # fmt: skip
    """``etl preprocess --cluster local:2`` of ``pipeline`` from ``raw`` into ``out``, killing (SIGKILL) every worker process it has,
    every ``every`` seconds from its start (``once_working``: from the first temporary written in ``out``, by a
    task or the fit's work directory) to its end (at most 120 s); the finished process (stdout and stderr)."""
    cmd = [sys.executable, "-m", "etl", "preprocess", "--pipeline", str(pipeline), "--input", str(raw), "--out", str(out), "--cluster", "local:2"]
    cmd += ["--artifacts", str(artifacts)] if artifacts is not None else []
    # a cluster whose workers all died for good fails its tasks after 5 s without any, not etl's default of a minute
    env = os.environ | {"DASK_DISTRIBUTED__SCHEDULER__NO_WORKERS_TIMEOUT": "5s"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        while once_working and proc.poll() is None and time.monotonic() < deadline:
            if out.is_dir() and any(is_temporary(p.name) for p in out.iterdir()):
                break
            time.sleep(0.005)
        while proc.poll() is None and time.monotonic() < deadline:
            for p in _worker_processes(parent):
                with contextlib.suppress(psutil.Error):
                    p.kill()
            time.sleep(every)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def test_a_worker_killed_while_the_cluster_starts_is_one_line_and_exit_2(raw: Path, tmp_path: Path) -> None:
    """Killed as soon as it is spawned, before it registers: Dask's Nanny gives up ("Nanny failed to start")."""
    proc = _preprocess_killing_workers(raw, tmp_path / "out", every=0.002)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == ["error: --cluster local:2: the local Dask cluster failed to start: Nanny failed to start "
                                                "worker process (a worker process killed, or out of memory?)"]  # fmt: skip


@pytest.mark.parametrize("fitted", [False, True], ids=["fit", "transform"])
def test_workers_killed_again_and_again_end_in_one_line_and_exit_2(raw: Path, reference: Path, tmp_path: Path, fitted: bool) -> None:
    """A kill storm: each worker process is killed every 0.3 s (their Nannies restart them, then give up) while the run
    fits on the cluster (the pipeline is being sent to them) or transforms (its tasks end up with no worker)."""
    artifacts = reference / "artifacts" if fitted else None
    proc = _preprocess_killing_workers(raw, tmp_path / "out", every=0.3, artifacts=artifacts, once_working=True)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and line.endswith("(killed, or out of memory?)"), line


EVENTS = REPO / "pipelines/events_sequence.yaml"
EVENT_ROWS = 200_000


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> tuple[Path, Path]:
    """Synthetic events and a threaded run of their History pipeline (its artifacts serve the cluster run)."""
    raw = tmp_path_factory.mktemp("events") / "raw"
    generate(load_schema(REPO / "schemas/events.yaml"), EVENT_ROWS, 4, raw, seed=3)
    out = tmp_path_factory.mktemp("events-ref") / "out"
    preprocess(Pipeline.from_file(EVENTS), list_shards(raw), out, workers=2, memory_budget="8M")
    return raw, out


def test_a_worker_killed_in_the_exchange_by_key_leaves_the_bytes_of_threads(events: tuple[Path, Path], tmp_path: Path) -> None:
    """History on a cluster (Dask's shuffle, then a task per partition): a worker process killed once the partitions
    are being written; Dask runs the lost work again and the output is the threaded run's, byte for byte."""
    raw, reference = events
    out = tmp_path / "out"
    writing = threading.Event()

    def progress(name: str, n: int) -> None:
        if name == "transform":
            writing.set()

    with connect("local:2") as client:
        failure: list[BaseException] = []

        def drive() -> None:
            try:
                preprocess(Pipeline.from_file(EVENTS), list_shards(raw), out, artifacts=reference / "artifacts", client=client, progress=progress,
                           memory_budget="8M")  # fmt: skip
            except BaseException as e:  # noqa: BLE001 - re-raised by the test thread
                failure.append(e)

        driver = threading.Thread(target=drive)
        driver.start()
        assert writing.wait(120), "no partition was written"
        pids = client.run(os.getpid)
        busy = [addr for addr, keys in client.processing().items() if keys] or list(pids)
        os.kill(pids[busy[0]], signal.SIGKILL)
        driver.join(180)
        assert not driver.is_alive() and not failure, failure
        assert set(client.run(os.getpid).values()) != set(pids.values())  # the killed worker was replaced
    assert tree_bytes(out) == tree_bytes(reference)
    assert not [p for p in out.rglob("*") if is_temporary(p.name)]


def test_workers_killed_again_and_again_in_the_exchange_by_key_end_in_one_line_and_exit_2(events: tuple[Path, Path], tmp_path: Path) -> None:
    """The kill storm of ``test_workers_killed_again_and_again_end_in_one_line_and_exit_2`` on History's run, from
    its first partition written: the shuffle's and the partitions' tasks end up with no worker."""
    raw, reference = events
    proc = _preprocess_killing_workers(raw, tmp_path / "out", every=0.3, artifacts=reference / "artifacts", once_working=True,
                                       pipeline=EVENTS)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and line.endswith("(killed, or out of memory?)"), line
