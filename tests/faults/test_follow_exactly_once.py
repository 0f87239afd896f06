"""Follow mode, exactly once: a producer adds shards (temporary name, then rename) at random moments while a
consumer process reads them with ``Loader(follow=True)`` and is killed with SIGKILL at random points and restarted,
several times. The multiset of rows the consumer counted equals the multiset written.

The consumer's checkpoint protocol is a training loop's: after each batch it appends the batch's row ids to a log
(its "training"), then atomically replaces its checkpoint, which holds the loader's ``state_dict`` and the log's
length. A batch counts only once the checkpoint after it is saved: a restart truncates the log to the length its
checkpoint records and resumes the loader from the state saved with it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import REPO

SCHEMA = """\
name: stream
columns:
  - {name: label, role: label, dtype: int64}
  - {name: rid, role: dense, dtype: int64}
"""
PIPELINE = """\
name: stream
schema: schema.yaml
ops:
  - {op: FillMissing, columns: [rid], value: 0}
"""

CONSUMER = """
import json, os, sys
from etl import Loader

raw, pipeline, work = sys.argv[1:4]
log, ckpt = os.path.join(work, "rows.log"), os.path.join(work, "ckpt.json")
loader = Loader(raw, pipeline=pipeline, batch_size=96, shuffle=True, shuffle_buffer=300, seed=7, follow=True,
                poll_interval=0.05, idle_flush=0.2, num_workers=2, prefetch=2)
length = 0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        saved = json.load(f)
    loader.load_state_dict(saved["state"])
    length = saved["log_bytes"]
with open(log, "ab") as f:
    f.truncate(length)  # rows logged after the last checkpoint were never counted
with open(log, "ab") as f:
    for batch in loader:
        f.write(("\\n".join(str(int(r)) for r in batch.dense[:, 0].tolist()) + "\\n").encode())
        f.flush()
        os.fsync(f.fileno())
        tmp = ckpt + ".tmp"
        with open(tmp, "w") as c:
            json.dump({"state": loader.state_dict(), "log_bytes": f.tell()}, c)
        os.replace(tmp, ckpt)
"""


def write_shard(raw: Path, index: int, first: int, rows: int, rng: random.Random) -> None:
    """Shard ``index``: row ids ``first .. first + rows - 1``, written under a temporary name and renamed."""
    table = pa.table({"label": pa.array(np.zeros(rows, np.int64)), "rid": pa.array(np.arange(first, first + rows, dtype=np.int64))})
    tmp = raw / f".part-{index:05d}.parquet.{os.getpid()}.tmp"
    pq.write_table(table, tmp, row_group_size=rng.randint(50, 400))
    os.replace(tmp, raw / f"part-{index:05d}.parquet")


def counted(work: Path) -> list[int]:
    """The row ids the consumer's last checkpoint counts."""
    ckpt = work / "ckpt.json"
    if not ckpt.exists():
        return []
    length = json.loads(ckpt.read_text())["log_bytes"]
    return [int(line) for line in (work / "rows.log").read_bytes()[:length].decode().split()]


KILLS = 5


def test_every_row_exactly_once_across_kills(tmp_path: Path) -> None:
    rng = random.Random(0)
    raw, work = tmp_path / "raw", tmp_path / "work"
    raw.mkdir()
    work.mkdir()
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    sizes = [rng.randint(1, 700) for _ in range(14)]
    total = sum(sizes)
    write_shard(raw, 0, 0, sizes[0], rng)
    done = threading.Event()

    def produce() -> None:
        first = sizes[0]
        for i, n in enumerate(sizes[1:], 1):
            time.sleep(rng.uniform(0, 0.5))
            write_shard(raw, i, first, n, rng)
            first += n
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", textwrap.dedent(CONSUMER), str(raw), str(tmp_path / "pipeline.yaml"), str(work)]
    kills = 0
    try:
        while True:
            consumer = subprocess.Popen(argv, cwd=REPO, env=env, stderr=subprocess.PIPE)
            try:
                if kills < KILLS:  # kill it at a random point once it has counted a few more batches
                    before = len(counted(work))
                    deadline = time.monotonic() + 60
                    while len(counted(work)) < before + rng.randint(1, 400) and consumer.poll() is None and time.monotonic() < deadline:
                        time.sleep(rng.uniform(0, 0.05))
                    assert consumer.poll() is None, consumer.stderr.read().decode() if consumer.stderr else ""
                    consumer.send_signal(signal.SIGKILL)
                    consumer.wait()
                    kills += 1
                    continue
                deadline = time.monotonic() + 60
                while not (done.is_set() and len(counted(work)) >= total) and time.monotonic() < deadline:
                    assert consumer.poll() is None, consumer.stderr.read().decode() if consumer.stderr else ""
                    time.sleep(0.05)
                time.sleep(0.3)  # a row delivered twice would show up now
                break
            finally:
                if consumer.poll() is None:
                    consumer.kill()
                consumer.wait()
                if consumer.stderr:
                    consumer.stderr.close()
    finally:
        producer.join()
    rows = counted(work)
    assert kills == KILLS
    assert Counter(rows) == Counter(range(total)), (len(rows), total)
