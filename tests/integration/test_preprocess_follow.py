"""``etl preprocess --follow`` as a user runs it: shards arriving while it runs, stopped by SIGTERM / SIGINT (exit 0,
the manifest consistent), resumed, and the output the same bytes as ``etl preprocess`` makes from the same shards."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from etl.io.arrivals_manifest import write_arrivals
from etl.io.parquet import list_shards
from etl.io.processed import open_processed, verify_part
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, run_etl, tree_bytes

HASH = REPO / "pipelines/criteo_hash.yaml"


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four shards a producer will hand over, one by one."""
    out = tmp_path_factory.mktemp("follow") / "staged"
    generate(load_schema(REPO / "schemas/criteo.yaml"), 8_000, 4, out, seed=5)
    return out


def hand_over(staged: Path, raw: Path, name: str) -> None:
    """Move a staged shard into ``raw`` as a producer must: under a temporary name, then renamed."""
    tmp = raw / f".{name}.0-0.tmp"
    tmp.write_bytes((staged / name).read_bytes())
    os.utime(tmp, ns=((staged / name).stat().st_atime_ns, (staged / name).stat().st_mtime_ns))
    tmp.rename(raw / name)


def follow(raw: Path, out: Path, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "etl", "preprocess", "--follow", "--poll-interval", "0.05", "--pipeline", str(HASH), "--input", str(raw)]
    argv += ["--out", str(out), *extra]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def reference(raw: Path, out: Path) -> dict[str, bytes]:
    """What ``etl preprocess`` writes from the shards of ``raw`` (run in this process: the CLI only parses)."""
    preprocess(Pipeline.from_file(HASH), list_shards(raw), out)
    return tree_bytes(out)


def listed(out: Path) -> int:
    try:
        return len(json.loads((out / "manifest.json").read_text())["files"])
    except (OSError, ValueError):
        return 0


def wait_for(cond, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_shards_arriving_are_appended_and_sigterm_stops_cleanly(staged: Path, tmp_path: Path) -> None:
    raw, out, ref = tmp_path / "raw", tmp_path / "out", tmp_path / "ref"
    raw.mkdir()
    names = sorted(p.name for p in staged.glob("*.parquet"))
    hand_over(staged, raw, names[0])
    proc = follow(raw, out)
    wait_for(lambda: listed(out) == 1, proc)
    for name in names[1:]:
        hand_over(staged, raw, name)
    wait_for(lambda: listed(out) == len(names), proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "4 transformed now" in stdout
    assert tree_bytes(out) == reference(raw, ref)


def test_sigint_at_any_point_leaves_a_consistent_output_and_a_rerun_completes_it(staged: Path, tmp_path: Path) -> None:
    raw, out, ref = tmp_path / "raw", tmp_path / "out", tmp_path / "ref"
    raw.mkdir()
    names = sorted(p.name for p in staged.glob("*.parquet"))
    proc = follow(raw, out)
    wait_for(lambda: (out / "manifest.json").exists(), proc)
    for name in names:
        hand_over(staged, raw, name)
    time.sleep(0.2)  # most likely inside a shard's transform
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    partial = open_processed(out, allow_partial=True)
    for entry in partial.manifest.files:
        verify_part(partial, entry)
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    rerun = follow(raw, out, "--stop-after-idle", "0.3")
    _, stderr = rerun.communicate(timeout=60)
    assert rerun.returncode == 0, stderr
    assert tree_bytes(out) == reference(raw, ref)


def test_manifest_order_transforms_the_shards_in_the_order_the_producer_lists_them(staged: Path, tmp_path: Path) -> None:
    raw, out, ref = tmp_path / "raw", tmp_path / "out", tmp_path / "ref"
    raw.mkdir()
    names = sorted((p.name for p in staged.glob("*.parquet")), reverse=True)  # listed against name order
    for name in names:
        shutil.copyfile(staged / name, raw / name)  # written in place: complete once listed
    (raw / "zz-partial.parquet").write_bytes(b"PAR1 half written")  # never listed, never read
    proc = follow(raw, out, "--arrivals", "manifest")
    wait_for(lambda: (out / "manifest.json").exists(), proc)
    assert listed(out) == 0  # no producer manifest yet: nothing has arrived
    write_arrivals(raw, names[:2])
    wait_for(lambda: listed(out) == 2, proc)
    write_arrivals(raw, names)
    wait_for(lambda: listed(out) == 4, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "4 transformed now" in stdout
    preprocess(Pipeline.from_file(HASH), [raw / name for name in names], ref)  # output file i: the i-th shard listed
    assert tree_bytes(out) == tree_bytes(ref)


def test_follow_takes_one_input_directory(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    raw = tmp_path / "raw"
    proc = run_etl("preprocess", "--follow", "--pipeline", HASH, "--input", raw, "--input", raw, "--out", tmp_path / "o", check=False)
    assert proc.returncode == 2 and "one input directory" in proc.stderr


def test_options_of_follow_mode_alone_are_refused(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    proc = run_etl("preprocess", "--stop-after-idle", "1", "--pipeline", HASH, "--input", raw, "--out", tmp_path / "o", check=False)
    assert proc.returncode == 2 and "go with --follow" in proc.stderr
    proc = run_etl("preprocess", "--arrivals", "manifest", "--pipeline", HASH, "--input", raw, "--out", tmp_path / "o", check=False)
    assert proc.returncode == 2 and "go with --follow" in proc.stderr
    proc = run_etl("preprocess", "--follow", "--arrivals", "mtime", "--pipeline", HASH, "--input", raw, "--out", tmp_path / "o", check=False)
    assert proc.returncode == 2 and "--arrivals" in proc.stderr and "mtime" in proc.stderr


def test_follow_writes_parquet_only(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    proc = run_etl("preprocess", "--follow", "--format", "parquet,npy", "--pipeline", HASH, "--input", raw, "--out", tmp_path / "o", check=False)
    assert proc.returncode == 2 and "--follow writes Parquet files" in proc.stderr and not (tmp_path / "o").exists()
