"""Follow mode, exactly once: a producer adds shards (temporary name, then rename) at random moments while a
consumer process reads them with ``Loader(follow=True)`` and is killed with SIGKILL at random points and restarted,
several times. The multiset of rows the consumer counted equals the multiset written.

The pipeline gives a categorical column ids with an online vocabulary (small, so that keys are admitted and
evicted all along): the ids and events of the counted batches equal those of one vocabulary fed these batches in
order without a restart (ids are given per batch, in its row order, and a restart resumes from the state after the
last counted batch), and the events account exactly for every id used: each row with a vocabulary id uses it for
the key its latest admission named, and an id is admitted again only in a batch after its eviction.

The consumer's checkpoint protocol is a training loop's: after each batch it appends the batch's row ids, ids and
events to a log (its "training"), then atomically replaces its checkpoint (a pickle of the loader's ``state_dict``,
whose vocabulary state is bytes, and the log's length). A batch counts only once the checkpoint after it is saved:
a restart truncates the log to the length its checkpoint records and resumes the loader from the state saved with
it.

The same with a streaming History (small ``max_keys``: keys evicted all along) on time-ordered shards: every row is
counted once with the history, length and padded history that an uninterrupted loader over the same shards gives
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
from collections.abc import Callable
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


def check_replay(tmp_path: Path, batches: list[dict]) -> None:
    """The counted batches' ids and events are those of the loader's starting vocabulary fed their keys, one update
    per batch, in order (as one uninterrupted run over these batches gives them)."""
    from etl import Loader

    loader = Loader(tmp_path / "raw", pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "work/artifacts", batch_size=512)
    assert loader.streams is not None
    vocab = loader.streams.states["cat"].vocab
    for n, b in enumerate(batches):
        ids, ev = vocab.update(KEYS[b["rid"]].astype(np.uint64))
        assert ids.tolist() == b["id"], n
        assert [ev.admitted_ids.tolist(), ev.admitted_keys.tolist()] == b["admitted"], n
        assert [ev.evicted_ids.tolist(), ev.evicted_keys.tolist()] == b["evicted"], n


def check_events(batches: list[dict]) -> int:
    """Walk the counted batches in order, as a trainer sees them, and return how many evictions there were.

    Exact: within a batch an id names one key (it is admitted at most once, evicted at most once, and only for the
    key it named); an id evicted in a batch is not admitted again in it; every row with a vocabulary id uses it for
    its own key, the one the id's latest admission named, and only while the id is admitted (from the batch that
    admits it to the batch that evicts it)."""
    live: dict[int, int] = {}  # id -> key, between batches
    evictions = 0
    for n, b in enumerate(batches):
        admitted, evicted = dict(zip(*b["admitted"])), dict(zip(*b["evicted"]))
        assert len(admitted) == len(b["admitted"][0]) and len(evicted) == len(b["evicted"][0]), n  # one key an id
        assert not set(admitted) & set(live), n  # an id is admitted again only after the batch evicting it
        named = live | admitted
        assert all(named.get(i) == key for i, key in evicted.items()), n
        for r, i in zip(b["rid"], b["id"]):
            if i >= FIRST_ID:
                assert named.get(i) == KEYS[r], (n, r, i)
        live = {i: key for i, key in named.items() if i not in evicted}
        evictions += len(evicted)
    return evictions


KILLS = 5


def kill_and_restart(argv: list[str], work: Path, total: int, done: threading.Event, rng: random.Random) -> int:
    """Run the consumer ``argv`` and kill it (SIGKILL) at random points, ``KILLS`` times, each time once it has
    counted a few more batches, restarting it; the last run goes on until ``done`` is set and every one of the
    ``total`` rows is counted. Returns the kills."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    kills = 0
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
            return kills
        finally:
            if consumer.poll() is None:
                consumer.kill()
            consumer.wait()
            if consumer.stderr:
                consumer.stderr.close()


def start_producer(raw: Path, sizes: list[int], rng: random.Random,
                   write: Callable[..., None] = write_shard) -> tuple[threading.Thread, threading.Event]:  # fmt: skip
    """A thread writing shards 1.. of ``sizes`` rows (shard 0 is written already) at random moments; the event is
    set once it wrote the last."""
    done = threading.Event()

    def produce() -> None:
        first = sizes[0]
        for i, n in enumerate(sizes[1:], 1):
            time.sleep(rng.uniform(0, 0.5))
            write(raw, i, first, n, rng)
            first += n
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    return producer, done


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
    producer, done = start_producer(raw, sizes, rng)
    argv = [sys.executable, "-c", textwrap.dedent(CONSUMER), str(raw), str(tmp_path / "pipeline.yaml"), str(work)]
    try:
        kills = kill_and_restart(argv, work, total, done, rng)
    finally:
        producer.join()
    rows = counted(work)
    assert kills == KILLS
    assert Counter(rows) == Counter(range(total)), (len(rows), total)
    batches = counted_batches(work)
    check_replay(tmp_path, batches)
    assert check_events(batches) > 0


# ---------------------------------------------------------------- streaming History
HISTORY_SCHEMA = """\
name: events
columns:
  - {name: label, role: label, dtype: int64}
  - {name: rid, role: dense, dtype: int64}
  - {name: user, role: categorical, dtype: int64}
  - {name: item, role: categorical, dtype: int64}
  - {name: ts, role: passthrough, dtype: int64}
"""
#: History over a small ``max_keys``, so that keys are evicted all along and the saved states hold evictions.
HISTORY_PIPELINE = """\
name: events
schema: schema.yaml
ops:
  - {op: FillMissing, columns: [rid], value: 0}
  - {op: Decode, columns: [user, item]}
  - {op: Hash, columns: [user, item], num_buckets: 1000}
  - {op: History, key: user, time: ts, columns: [item], max_len: 4, max_keys: 12}
"""
#: The user of row ``rid``: a skewed draw over 40 users, more than ``max_keys``.
USERS = np.random.default_rng(1).zipf(1.3, 20_000) % 40

HISTORY_CONSUMER = """
import json, os, pickle, sys
from etl import Loader

raw, pipeline, work, mode = sys.argv[1:5]
log, ckpt = os.path.join(work, "rows.log"), os.path.join(work, "ckpt.pkl")
kw = dict(pipeline=pipeline, batch_size=64, shuffle=False, num_workers=2, prefetch=2, pad_to=3, pad_side="left")
if mode == "once":  # the uninterrupted reference: every shard, one epoch
    loader = Loader(raw, **kw)
else:
    loader = Loader(raw, follow=True, poll_interval=0.05, idle_flush=0.2, **kw)
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
        values, offsets = batch.lists["hist_item"]
        line = {"rid": batch.dense[:, 0].long().tolist(), "len": batch.lengths["hist_len"].tolist(),
                "hist": [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(batch))],
                "padded": batch.padded["hist_item"].tolist()}
        f.write((json.dumps(line) + "\\n").encode())
        f.flush()
        os.fsync(f.fileno())
        tmp = ckpt + ".tmp"
        with open(tmp, "wb") as c:
            pickle.dump({"state": loader.state_dict(), "log_bytes": f.tell()}, c)
        os.replace(tmp, ckpt)
"""


def write_events(raw: Path, index: int, first: int, rows: int, rng: random.Random) -> None:
    """Shard ``index`` of events ``first .. first + rows - 1`` in time order (two rows a time unit: equal times
    across shard ends too), written under a temporary name and renamed."""
    rid = np.arange(first, first + rows, dtype=np.int64)
    table = pa.table({"label": pa.array(np.zeros(rows, np.int64)), "rid": pa.array(rid), "user": pa.array(USERS[rid]),
                      "item": pa.array(rid % 97), "ts": pa.array(rid // 2)})  # fmt: skip
    tmp = raw / f".part-{index:05d}.parquet.{os.getpid()}.tmp"
    pq.write_table(table, tmp, row_group_size=rng.randint(50, 400))
    os.replace(tmp, raw / f"part-{index:05d}.parquet")


def histories(work: Path) -> dict[int, tuple[list[int], int, list[int]]]:
    """Each counted row's (history, length, padded history), by row id; every row once."""
    out = {}
    for b in counted_batches(work):
        for r, hist, n, padded in zip(b["rid"], b["hist"], b["len"], b["padded"]):
            assert r not in out, r
            assert n == len(hist) and padded == [0] * (3 - min(n, 3)) + hist[-3:], r  # pad_to=3, pad_side="left"
            out[r] = (hist, n, padded)
    return out


def test_streaming_histories_across_kills(tmp_path: Path) -> None:
    """A following loader with a streaming History, killed and restarted from its checkpoints, counts every row
    once with the history (lists, lengths and padded lists) an uninterrupted loader over the same shards gives it."""
    rng = random.Random(3)
    raw, work = tmp_path / "raw", tmp_path / "work"
    raw.mkdir()
    work.mkdir()
    (tmp_path / "schema.yaml").write_text(HISTORY_SCHEMA)
    (tmp_path / "pipeline.yaml").write_text(HISTORY_PIPELINE)
    sizes = [rng.randint(1, 700) for _ in range(12)]
    total = sum(sizes)
    write_events(raw, 0, 0, sizes[0], rng)
    producer, done = start_producer(raw, sizes, rng, write_events)
    argv = [sys.executable, "-c", textwrap.dedent(HISTORY_CONSUMER), str(raw), str(tmp_path / "pipeline.yaml"), str(work), "follow"]
    try:
        kills = kill_and_restart(argv, work, total, done, rng)
    finally:
        producer.join()
    assert kills == KILLS
    got = histories(work)
    assert sorted(got) == list(range(total))
    once = tmp_path / "once"
    once.mkdir()
    subprocess.run([*argv[:-2], str(once), "once"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, capture_output=True)
    want = histories(once)
    assert got == want
    assert sum(1 for _, n, _ in want.values() if n == 4) > 0 and sum(1 for _, n, _ in want.values() if n == 0) > 40  # evicted keys start empty
