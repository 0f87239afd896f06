"""Online vocabularies in the loader: where the ids of ``Categorify`` with ``online: true`` are given, and how their
state follows the loader's position.

Where: the worker threads pass such columns through as keys (``Chunk.fixed["online_keys:<column>"]`` uint64 and
``"online_valid:<column>"`` bool, see ``etl.loader.chunk``); the assembler thread, which sees the pass's rows in one
fixed order (the rank's row order, before any shuffling) whatever the number of workers, runs every row through
the vocabularies (``etl.ops.online_vocab``) as it puts them into shuffle buffers, and writes their ids into the
rows' ``sparse`` field. The ids are therefore a function of the row sequence alone: the same for any
``num_workers``, and the same when a pass resumes (it restarts from the state at the start of the shuffle buffer
it re-reads, cut at that buffer's first row exactly as the uninterrupted pass was, since updates go row by row).

Events: the admissions and evictions made by the rows of shuffle buffer ``b`` ride on the first batch holding a
row of buffer ``b`` (``LoaderBatch.vocab_events``); any batch using an id given in buffer ``b`` comes at or after
that batch. Rows are shuffled after they get their ids, so a batch can hold rows given an id before an eviction
that an earlier batch carried: rows from the end of buffer ``b - 1`` in the batch carrying buffer ``b``'s events,
and rows of buffer ``b`` itself given the id before the eviction (a reused id then names the evicted key's row in
those rows). A buffer's rows leave in consecutive batches: no row of a later buffer uses an evicted id for its old
key.

State: the assembler runs ahead of the consumer, so the vocabularies keep a snapshot at the start of each shuffle
buffer (and at the end of the epoch) until the consumer is past it. The loader's state (``state_dict``,
``save_vocabulary``) is the snapshot at the start of the buffer holding the next batch's first row: the state a
resumed pass starts from. A pass closed early leaves the vocabularies at that same state (rows read ahead but
never delivered do not count), so the vocabulary is a function of the batches delivered. A snapshot copies the
tables: up to 2 * capacity entries of 32 bytes per column, once per shuffle buffer; the snapshots of the buffers
between the consumer and the assembler are held: one per buffer holding rows of the batches in the ring (``prefetch
+ 2`` slots, at most two new buffers per batch when ``shuffle_buffer >= batch_size``) or of the piece being cut,
plus the one being filled: at most ``2 * (prefetch + 2) + piece rows // shuffle_buffer + 3``, and a few with the
default ``shuffle_buffer`` of 4 batches.

Follow mode (``etl.loader.follow``) is one endless pass, numbered epoch 0: its buffers are the following pass's,
its snapshots are keyed by their numbers, and the state at a ``FollowPosition`` is the snapshot at the start of
the position's buffer (the first not wholly delivered), so a restart re-applies exactly the rows from there and
gives the rows not yet delivered the ids and events of an uninterrupted run. The held snapshots stay as few as in
an epoch however many shards arrive: an idle flush delivers every buffered row, or with ``drop_last`` closes the
buffer only when that lets a batch out (``FollowAssembler``), so short buffers never pile up behind the consumer.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from etl.errors import ArtifactError, ConfigError
from etl.io.arrow import from_numpy, to_numpy
from etl.io.fs import Location
from etl.loader.chunk import Chunk, ChunkRun
from etl.ops import Categorify
from etl.ops.base import InvalidState
from etl.ops.online_vocab import VocabEvents, canonical_state
from etl.pipeline import Pipeline, artifacts

#: The state of every online column: ``OnlineVocab.export`` by column name.
State = dict[str, dict[str, Any]]
#: A snapshot's place: (epoch, shuffle buffer number), or (epoch, ``END``) once the epoch's rows are all applied.
Key = tuple[int, int]
END = -1

#: The columns and types of an online vocabulary table (an artifact), sorted by key; ``id`` -1: a candidate.
TABLE_SCHEMA = pa.schema([("key", pa.uint64()), ("count", pa.int64()), ("last", pa.int64()), ("id", pa.int64())])
_ARRAYS = {"key": np.uint64, "count": np.int64, "last": np.int64, "id": np.int64}


class OnlineVocabularies:
    """The online vocabularies of a loader (one per online column, in ``columns`` order: the layout's
    ``online``), their snapshots, and the state a pass starts from (``base``)."""

    def __init__(self, pipeline: Pipeline, columns: list[str], sparse: list[str]):
        by_column = {c: op for op in pipeline.ops if isinstance(op, Categorify) for c in op.columns}
        self.columns = columns
        self.vocabs = {c: by_column[c].online_vocab(c) for c in columns}
        self.sparse_index = [sparse.index(c) for c in columns]
        self.base: State = self._export()
        self._snapshots: dict[Key, State] = {}
        self._lock = threading.Lock()

    def _export(self) -> State:
        return {c: v.export() for c, v in self.vocabs.items()}

    # ------------------------------------------------------------------ the assembler's side
    def start_pass(self, key: Key, skip: bool) -> OnlinePass:
        """Set the vocabularies to ``base`` for a pass starting at ``key``; ``skip``: the pass drops rows of its first
        buffer (a resume in the middle of it: that buffer's events were delivered before)."""
        for c, v in self.vocabs.items():
            v.restore(self.base[c])
        with self._lock:
            self._snapshots = {key: self.base}
        return OnlinePass(self, key[0], skip)

    def snapshot(self, key: Key) -> None:
        state = {c: v.export(canonical=False) for c, v in self.vocabs.items()}
        with self._lock:
            self._snapshots[key] = state

    # ------------------------------------------------------------------ the consumer's side
    def at(self, key: Key) -> State:
        """The state at ``key``: its snapshot, or ``base`` when the current pass has none (no pass reached it)."""
        with self._lock:
            return self._snapshots.get(key, self.base)

    def commit(self, key: Key) -> None:
        """Make the state at ``key`` the one the next pass starts from (and forget the snapshots)."""
        with self._lock:
            self.base = self._snapshots.get(key, self.base)
            self._snapshots = {}

    def prune(self, key: Key) -> None:
        """Forget the snapshots before ``key`` (the consumer is past them)."""
        with self._lock:
            for k in [k for k in self._snapshots if k[0] < key[0] or (k[0] == key[0] and 0 <= k[1] < key[1])]:
                del self._snapshots[k]
            if key[1] == END:
                for k in [k for k in self._snapshots if k[0] == key[0] and k[1] != END]:
                    del self._snapshots[k]

    # ------------------------------------------------------------------ state
    @staticmethod
    def to_dict(state: State) -> dict[str, Any]:
        """A state as plain values: per column ``rows`` (int) and ``key``, ``count``, ``last``, ``id`` as the bytes of
        little-endian arrays (uint64, int64, int64, int64), sorted by key (``etl.ops.online_vocab``)."""
        state = {c: canonical_state(s) for c, s in state.items()}
        return {c: {"rows": int(s["rows"]), **{k: np.asarray(s[k], np.dtype(t).newbyteorder("<")).tobytes() for k, t in _ARRAYS.items()}}
                for c, s in state.items()}  # fmt: skip

    def load_dict(self, doc: Any) -> None:
        """Take a ``to_dict`` state as ``base`` (``ConfigError`` when it is not one of these vocabularies)."""
        if not isinstance(doc, dict) or sorted(doc) != sorted(self.columns):
            raise ConfigError(f"state_dict: online vocabularies of columns {sorted(doc) if isinstance(doc, dict) else doc!r}, "
                              f"this loader has {sorted(self.columns)}")  # fmt: skip
        try:
            state = {c: {"rows": int(d["rows"]), **{k: np.frombuffer(d[k], np.dtype(t).newbyteorder("<")).astype(t) for k, t in _ARRAYS.items()}}
                     for c, d in doc.items()}  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"state_dict: malformed online vocabulary state: {e}") from None
        self._take(state, lambda c, e: ConfigError(f"state_dict: online vocabulary of '{c}': {e}"))

    def _take(self, state: State, error: Callable[[str, Exception], Exception]) -> None:
        """Check ``state`` against the vocabularies (restoring each) and make it ``base``."""
        for c, v in self.vocabs.items():
            try:
                v.restore(state[c])
            except InvalidState as e:
                raise error(c, e) from None
        with self._lock:
            self.base = self._export()
            self._snapshots = {}

    def save(self, state: State, directory: str | Location) -> None:
        """Write ``state`` as artifacts (``etl.pipeline.artifacts.save_online``): JSON + one Parquet table per column."""
        state = {c: canonical_state(s) for c, s in state.items()}
        doc = {c: {"rows": int(s["rows"])} for c, s in state.items()}
        tables = {c: pa.Table.from_arrays([from_numpy(np.asarray(s[k], t)) for k, t in _ARRAYS.items()], schema=TABLE_SCHEMA)
                  for c, s in state.items()}  # fmt: skip
        artifacts.save_online(directory, doc, tables)

    def load(self, directory: str | Location) -> None:
        """Take the state saved in ``directory`` as ``base`` (``ArtifactError`` naming the file when it is not a state
        of these vocabularies)."""
        path, doc, tables = artifacts.load_online(directory)
        if sorted(tables) != sorted(self.columns):
            raise ArtifactError(f"{path}: online vocabularies of columns {sorted(tables)}, this loader has {sorted(self.columns)}")
        state: State = {}
        for c, (where, t) in tables.items():
            if not t.schema.equals(TABLE_SCHEMA) or any(t.column(k).null_count for k in _ARRAYS):
                raise ArtifactError(f"{where}: expected columns {TABLE_SCHEMA.names} typed {[str(f.type) for f in TABLE_SCHEMA]}, no nulls")
            rows = doc[c].get("rows")
            if not isinstance(rows, int) or isinstance(rows, bool):
                raise ArtifactError(f"{path}: field 'columns.{c}.rows': expected an integer, got {rows!r}")
            state[c] = {"rows": rows, **{k: to_numpy(t.column(k)) for k in _ARRAYS}}
        self._take(state, lambda c, e: ArtifactError(f"{tables[c][0]}: {e}"))


class OnlinePass:
    """One pass's use of the vocabularies, from the assembler thread: ``apply`` to each piece of rows in order,
    ``close_buffer`` when a shuffle buffer fills (or a following pass closes it early), ``end`` once every row of
    the epoch is applied (never, in a following pass), ``events_of`` for each batch."""

    def __init__(self, vocabs: OnlineVocabularies, epoch: int, skip: bool):
        self.vocabs, self.epoch = vocabs, epoch
        self.threads = max(1, min(len(vocabs.columns), os.cpu_count() or 1))
        self.drop_first = skip
        self.filling: list[dict[str, VocabEvents]] = []  # events of the buffer being filled
        self.pending: dict[ChunkRun, dict[str, VocabEvents]] = {}  # events of buffers none of whose rows left yet

    def apply(self, chunk: Chunk) -> None:
        """Give ids to the rows of ``chunk`` (in order), in its ``sparse`` field. The columns are independent: each
        is updated on a thread of a pool that lives for this call (the kernels release the GIL); each column's
        rows still go through its vocabulary in order."""
        v, fixed = self.vocabs, chunk.fixed
        with ThreadPoolExecutor(self.threads, thread_name_prefix="etl-online-vocab") as pool:
            done = {c: pool.submit(v.vocabs[c].update, fixed[f"online_keys:{c}"], fixed[f"online_valid:{c}"]) for c in v.columns}
        events = {}
        for (c, future), j in zip(done.items(), v.sparse_index):
            ids, events[c] = future.result()
            fixed["sparse"][:, j] = ids  # here, not in the threads: they would share the rows' cache lines
        self.filling.append(events)

    def close_buffer(self, buf: ChunkRun, next_buffer: int) -> None:
        """Buffer ``buf`` is full: hold its events for its first batch, and snapshot the start of the next one."""
        events = {c: VocabEvents.concat([e[c] for e in self.filling]) for c in self.vocabs.columns}
        if not self.drop_first:
            self.pending[buf] = events
        self.drop_first, self.filling = False, []
        self.vocabs.snapshot((self.epoch, next_buffer))

    def end(self) -> None:
        """Every row of the epoch went through the vocabularies."""
        self.vocabs.snapshot((self.epoch, END))

    def events_of(self, buffers: list[ChunkRun]) -> dict[str, VocabEvents]:
        """The events a batch made of rows of ``buffers`` (in order) carries: those of each buffer it is the first
        to hold rows of."""
        found = [self.pending.pop(b) for b in buffers if b in self.pending]
        return {c: VocabEvents.concat([e[c] for e in found]) for c in self.vocabs.columns}
