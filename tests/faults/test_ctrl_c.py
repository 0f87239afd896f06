"""Ctrl-C (SIGINT) during ``etl preprocess`` and ``etl convert``: exit status 130 and one line on stderr that says what
is kept and the command that goes on (for preprocess, the count agrees with the manifest, and the command shown
resumes, skipping what was written)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from etl.io.files import is_temporary
from etl.io.processed import read_manifest
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import CRITEO_8K, run_etl

SHARDS = 200


def interrupt_once(cmd: list[str], cwd: Path, started: Callable[[], bool]) -> subprocess.CompletedProcess:
    """Run ``cmd`` and send it SIGINT (what Ctrl-C sends) as soon as ``started()``; the finished process."""
    proc = subprocess.Popen([sys.executable, "-m", "etl", *cmd], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and not started() and time.monotonic() < deadline:
            time.sleep(0.002)
        assert proc.poll() is None, "the command ended before Ctrl-C; give it more data"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Many small shards: a run interrupted after its first commits has most of them still to write."""
    d = tmp_path_factory.mktemp("ctrl_c") / "raw"
    generate(load_schema("criteo"), 200_000, SHARDS, d, seed=3)
    return d


def test_ctrl_c_in_preprocess_says_what_is_written_and_how_to_resume(raw: Path, tmp_path: Path) -> None:
    cmd = ["preprocess", "--pipeline", "criteo_hash", "--input", str(raw), "--out", "out", "--workers", "1"]
    line = one_line(interrupt_once(cmd, tmp_path, lambda: (tmp_path / "out/part-00001.parquet").exists()))
    done = len(read_manifest(tmp_path / "out").files)
    assert 0 < done < SHARDS
    assert line == f"interrupted: {done} of {SHARDS} shards written to out; the same command resumes: etl {' '.join(cmd)}"
    resumed = run_etl(*line.split(": etl ", 1)[1].split(), cwd=tmp_path)
    assert f"files: {SHARDS} ({done} already complete, skipped)" in resumed.stdout


@pytest.mark.skipif(not CRITEO_8K.is_dir(), reason=f"real Criteo sample not at {CRITEO_8K}")
def test_ctrl_c_in_convert_says_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "big.tsv").write_text((CRITEO_8K / "train.csv").read_text() * 30)
    out = tmp_path / "raw"
    cmd = ["convert", "big.tsv", "--schema", "criteo", "--out", "raw", "--rows-per-file", "5000"]
    line = one_line(interrupt_once(cmd, tmp_path, lambda: out.is_dir() and any(is_temporary(p.name) for p in out.iterdir())))
    assert line == ("interrupted: nothing written to raw (convert renames its shards into place once all are written); the same "
                    f"command starts again: etl {' '.join(cmd)}")  # fmt: skip
    assert list(out.iterdir()) == []
