"""kill -9 at random moments of ``etl preprocess``: no partial file ever appears under a final name (a poller reads
the footer of every ``part-*.parquet`` and the whole of every npy chunk it sees while the run goes on), and rerunning
after each kill ends with the same bytes as an undisturbed run, Parquet only or with npy chunks."""

from __future__ import annotations

import hashlib
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from etl.io.files import is_shard_name, is_temporary
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, run_etl

PIPELINE = REPO / "pipelines/criteo.yaml"


def digests(out: Path) -> dict[str, str]:
    """sha256 of every file under ``out`` (the manifest included: both runs read the same input paths)."""
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*")) if p.is_file()}


class Poller(threading.Thread):
    """Reads the footer of every final-named part file while a run goes on; records what could not be read."""

    def __init__(self, out: Path):
        super().__init__(daemon=True)
        self.out, self.stop, self.bad = out, threading.Event(), []

    def run(self) -> None:
        while not self.stop.is_set():
            for d in (self.out, self.out / "quarantine"):
                for p in list(d.iterdir()) if d.is_dir() else []:
                    if not is_shard_name(p.name):
                        continue
                    try:
                        pq.ParquetFile(p).metadata  # noqa: B018 - reading the footer is the check
                    except FileNotFoundError:
                        continue  # replaced between listing and reading
                    except Exception as e:  # noqa: BLE001 - any unreadable final file is a failure
                        self.bad.append(f"{p.name}: {type(e).__name__}: {e}")
            for p in list(self.out.glob("npy/*/*.npy")):
                if is_temporary(p.name):
                    continue
                try:
                    np.load(p, mmap_mode="r")[-1:].copy()  # the header and the last row: a truncated file fails
                except FileNotFoundError:
                    continue
                except Exception as e:  # noqa: BLE001 - any unreadable final file is a failure
                    self.bad.append(f"{p}: {type(e).__name__}: {e}")
            time.sleep(0.002)


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """400,000 raw rows in 8 shards: enough for a run to be killed at random moments while it writes."""
    d = tmp_path_factory.mktemp("kill") / "raw"
    generate(load_schema(REPO / "schemas/criteo.yaml"), 400_000, 8, d, seed=11)
    return d


@pytest.mark.parametrize("formats", [[], ["--format", "parquet,npy", "--npy-chunk-rows", "16384"]], ids=["parquet", "parquet+npy"])
def test_kill_9_then_resume_is_byte_identical(raw: Path, tmp_path: Path, formats: list[str]) -> None:
    reference = tmp_path / "reference"
    run_etl("preprocess", "--pipeline", PIPELINE, "--input", raw, "--out", reference, "--workers", "2", *formats)
    want = digests(reference)
    rng = random.Random(5)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "etl", "preprocess", "--pipeline", str(PIPELINE), "--input", str(raw), "--out", str(out), "--workers", "2", *formats]
    kills = 0
    for _ in range(5):
        poller = Poller(out)
        poller.start()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, 2.5))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        poller.stop.set()
        poller.join()
        assert not poller.bad, poller.bad
    if kills == 0:
        pytest.skip("every run finished before its kill: nothing was interrupted")
    run_etl("preprocess", "--pipeline", PIPELINE, "--input", raw, "--out", out, "--workers", "2", *formats)
    assert digests(out) == want
