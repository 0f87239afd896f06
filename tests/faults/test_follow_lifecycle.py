"""A following loader waiting for shards is left by Ctrl-C, by ``break`` and dropped, or still alive at exit: the
process ends at once each time (run in a subprocess with a timeout, so a hang fails the test)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO

PIPELINE = "name: stream\nschema: schema.yaml\nops:\n  - {op: FillMissing, columns: [rid], value: 0}\n"
SCHEMA = "name: stream\ncolumns:\n  - {name: label, role: label, dtype: int64}\n  - {name: rid, role: dense, dtype: int64}\n"

OPEN = """
    import sys, etl
    loader = etl.Loader(sys.argv[1], pipeline=sys.argv[2], batch_size=50, follow=True, poll_interval=0.05, idle_flush=0.1)
    it = iter(loader)
    next(it), next(it)
    print("waiting", flush=True)
"""


@pytest.fixture()
def stream(tmp_path: Path) -> list[str]:
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    (tmp_path / "raw").mkdir()
    pq.write_table(pa.table({"label": np.zeros(100, np.int64), "rid": np.arange(100, dtype=np.int64)}), tmp_path / "raw/part-00000.parquet")
    return [str(tmp_path / "raw"), str(tmp_path / "pipeline.yaml")]


def start(code: str, args: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "waiting\n", proc.communicate()
    return proc


def finish(proc: subprocess.Popen, timeout: float = 30) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"hung for {timeout} s")


def test_ctrl_c_while_waiting_for_a_shard(stream: list[str]) -> None:
    proc = start(OPEN + "    next(it)\n", stream)
    proc.send_signal(signal.SIGINT)
    _, stderr = finish(proc)
    assert "KeyboardInterrupt" in stderr and proc.returncode != 0


def test_leaving_a_waiting_loader_ends_the_process(stream: list[str]) -> None:
    """Dropped while waiting (garbage-collected), closed, then one still waiting when the interpreter exits."""
    leave = """
        del it, loader
        import gc; gc.collect()
        loader = etl.Loader(sys.argv[1], pipeline=sys.argv[2], batch_size=50, follow=True, poll_interval=0.05)
        it = iter(loader)
        next(it)
        loader.close()
        it = iter(loader)
        next(it)
        print("done", file=sys.stderr, flush=True)
    """
    proc = start(OPEN + textwrap.indent(textwrap.dedent(leave), "    "), stream)
    _, stderr = finish(proc)
    assert proc.returncode == 0 and stderr.endswith("done\n"), stderr
