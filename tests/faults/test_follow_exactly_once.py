"""Follow mode, exactly once: a producer adds shards (temporary name, then rename) at random moments while a
consumer process reads them with ``Loader(follow=True)`` and is killed with SIGKILL at random points and restarted,
several times. The multiset of rows the consumer counted equals the multiset written.

The pipeline gives a categorical column ids with an online vocabulary (small, so that keys are admitted and
evicted all along): every counted row's id equals the one an uninterrupted loader gives that row (ids are a
function of the row sequence, and a restart re-applies the rows from the saved buffer's start), and the events of
the counted batches, in order, account for every id used (admitted before use, not used for an evicted key after).

The consumer's checkpoint protocol is a training loop's: after each batch it appends the batch's row ids, ids and
events to a log (its "training"), then atomically replaces its checkpoint (a pickle of the loader's ``state_dict``,
whose vocabulary state is bytes, and the log's length). A batch counts only once the checkpoint after it is saved:
a restart truncates the log to the length its checkpoint records and resumes the loader from the state saved with
it."""

from __future__ import annotations

import json
import os
import pickle
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
  - {name: cat, role: categorical, dtype: int64}
"""
PIPELINE = """\
name: stream
schema: schema.yaml
ops:
  - {op: FillMissing, columns: [rid], value: 0}
  - {op: Decode, columns: [cat]}
  - {op: Categorify, columns: [cat], online: true, capacity: 16, admit_after: 2, max_size: 0, evict: lfu}
"""
#: The key of row ``rid`` in column ``cat``: a skewed draw, so that frequent keys stay and rare ones churn.
KEYS = np.random.default_rng(0).zipf(1.5, 20_000) % 64
#: The rows of the consumer's shuffle buffer and batch: a buffer's rows are delivered within this many rows of its first batch.
WINDOW = 300 + 96
#: The first id of the online vocabulary: 0 padding, 1 missing, 2 the out-of-vocabulary bucket.
FIRST_ID = 3

CONSUMER = """
import json, os, pickle, sys
from etl import Loader

raw, pipeline, work = sys.argv[1:4]
log, ckpt = os.path.join(work, "rows.log"), os.path.join(work, "ckpt.pkl")
loader = Loader(raw, pipeline=pipeline, artifacts=os.path.join(work, "artifacts"), batch_size=96, shuffle=True, shuffle_buffer=300,
                seed=7, follow=True, poll_interval=0.05, idle_flush=0.2, num_workers=2, prefetch=2)
length = 0
if os.path.exists(ckpt):
    with open(ckpt, "rb") as f:
        saved = pickle.load(f)
    loader.load_state_dict(saved["state"])
    length = saved["log_bytes"]
with open(log, "ab") as f:
    f.truncate(length)  # rows logged after the last checkpoint were never counted
with open(log, "ab") as f:
    for batch in loader:
        ev = batch.vocab_events["cat"]
        line = {"rid": batch.dense[:, 0].long().tolist(), "id": batch.sparse[:, 0].tolist(),
                "admitted": [ev.admitted_ids.tolist(), ev.admitted_keys.tolist()],
                "evicted": [ev.evicted_ids.tolist(), ev.evicted_keys.tolist()]}
        f.write((json.dumps(line) + "\\n").encode())
        f.flush()
        os.fsync(f.fileno())
        tmp = ckpt + ".tmp"
        with open(tmp, "wb") as c:
            pickle.dump({"state": loader.state_dict(), "log_bytes": f.tell()}, c)
        os.replace(tmp, ckpt)
"""


def write_shard(raw: Path, index: int, first: int, rows: int, rng: random.Random) -> None:
    """Shard ``index``: row ids ``first .. first + rows - 1``, written under a temporary name and renamed."""
    rid = np.arange(first, first + rows, dtype=np.int64)
    table = pa.table({"label": pa.array(np.zeros(rows, np.int64)), "rid": pa.array(rid), "cat": pa.array(KEYS[rid])})
    tmp = raw / f".part-{index:05d}.parquet.{os.getpid()}.tmp"
    pq.write_table(table, tmp, row_group_size=rng.randint(50, 400))
    os.replace(tmp, raw / f"part-{index:05d}.parquet")


def counted_batches(work: Path) -> list[dict]:
    """The batches the consumer's last checkpoint counts, as logged."""
    ckpt = work / "ckpt.pkl"
    if not ckpt.exists():
        return []
    length = pickle.loads(ckpt.read_bytes())["log_bytes"]
    return [json.loads(line) for line in (work / "rows.log").read_bytes()[:length].decode().splitlines()]


def counted(work: Path) -> list[int]:
    """The row ids the consumer's last checkpoint counts."""
    return [r for batch in counted_batches(work) for r in batch["rid"]]


def uninterrupted_ids(tmp_path: Path) -> dict[int, int]:
    """Each row's id from a loader that reads every shard in one pass (not following: the same row sequence)."""
    from etl import Loader

    loader = Loader(tmp_path / "raw", pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "work/artifacts", batch_size=512)
    return {r: i for b in loader for r, i in zip(b.dense[:, 0].long().tolist(), b.sparse[:, 0].tolist())}


def check_events(batches: list[dict]) -> int:
    """Walk the counted batches in order, as a trainer sees them, and return how many evictions there were.

    Per id, a batch's events are a chain: the key it named before (if any), then each key admitted to it in the
    batch, each evicted in turn (an eviction comes right before the admission that reuses the id); the last one not
    evicted names it after the batch. Every row with a vocabulary id uses it for its own key, which the id names
    by then (an id is used only once admitted), or named until an eviction carried at most ``WINDOW`` rows before
    (a row of the evicting shuffle buffer given the id before the eviction: a buffer's rows leave together, within
    a buffer's length of its first batch); never later."""
    live: dict[int, int] = {}  # id -> key
    gone: dict[tuple[int, int], int] = {}  # (id, key) -> where the batch carrying its eviction starts
    row = evictions = 0
    for b in batches:
        admitted, evicted = _by_id(*b["admitted"]), _by_id(*b["evicted"])
        chains = {i: ([live[i]] if i in live else []) + admitted.get(i, []) for i in set(admitted) | set(evicted)}
        for i, chain in chains.items():
            out = evicted.get(i, [])
            assert chain[: len(out)] == out and len(chain) - len(out) <= 1, (i, chain, out)  # one key at a time
            gone.update(((i, key), row) for key in out)
            if len(chain) > len(out):
                live[i] = chain[-1]
                gone.pop((i, chain[-1]), None)
            else:
                live.pop(i, None)
        evictions += len(b["evicted"][0])
        for r, i in zip(b["rid"], b["id"]):
            if i >= FIRST_ID:
                assert live.get(i) == KEYS[r] or row - gone.get((i, int(KEYS[r])), -WINDOW) < WINDOW, (r, i)
        row += len(b["rid"])
    return evictions


def _by_id(ids: list[int], keys: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, key in zip(ids, keys):
        out.setdefault(i, []).append(key)
    return out


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
    subprocess.run([sys.executable, "-m", "etl", "fit", "--pipeline", tmp_path / "pipeline.yaml", "--input", raw, "--artifacts",
                    work / "artifacts"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, capture_output=True)  # fmt: skip
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
    expected = uninterrupted_ids(tmp_path)
    batches = counted_batches(work)
    assert [i for b in batches for i in b["id"]] == [expected[r] for r in rows]
    assert check_events(batches) > 0
