"""Online vocabularies in the loader: where the ids of ``Categorify`` with ``online: true`` are given, and how their
state follows the loader's position.

Where: the worker threads pass such columns through as keys (``Chunk.fixed["online_keys:<column>"]`` uint64 and
``"online_valid:<column>"`` bool, see ``etl.loader.chunk``); the assembler thread, when it gathers a batch into its
ring slot (after shuffling), runs the batch's keys through the vocabularies (``etl.ops.online_vocab``) in the
batch's row order, one update per batch, and writes their ids into the slot's ``sparse`` columns before the slot's
copy starts. The batches are a function of the data, seed and settings whatever the number of workers, so the ids
are too, and the same when a pass resumes.

Events: a batch carries exactly the admissions and evictions its own rows made (``LoaderBatch.vocab_events``). An
id evicted in batch ``b`` is given again at the earliest in batch ``b + 1`` (``OnlineVocab``'s deferred reuse), so
within a batch an id names one key, and a trainer that resets the embedding rows of a batch's ``admitted_ids``
before its step is exact: no row of the evicted key uses the id in or after the batch that admits the new key.

State: the state at batch position ``p`` of an epoch is the state after its first ``p`` batches (the first batch
of a pass starts from ``base``). The assembler runs ahead of the consumer, so the state at any position between
them must remain available. The vocabularies hold the state after the last batch assembled, and each batch also
records what it changed (``OnlineVocab.update_with_undo``: every table entry it changed, as it was before), kept
until the consumer is past the batch; the state at a position is the current one with the records of the batches
after it laid over it, newest first, made only when asked for. The loader's state (``state_dict``,
``save_vocabulary``) is the state at the consumer's position: the state a resumed pass starts from, which then
gives the remaining batches the ids and events of an uninterrupted run. A pass closed early leaves the
vocabularies at that same state (batches assembled but never delivered do not count). A pass restores ``base``
into the vocabularies only when they do not hold it already (they do after a pass that ran to its end).

Memory: ``base`` (one state: at most ``2 * capacity`` entries of 32 bytes per column), and per batch assembled and
not yet consumed (each holds a ring slot: at most ``prefetch + 2``) 40 bytes per entry it changed and per column:
at most twice its rows and at most ``2 * capacity`` (about one per row on a column whose keys are mostly new, a few
on a column of a few keys). Making a state copies each column's table once (``2 * capacity`` entries of 32 bytes)
while the assembler waits for the copy; that happens at ``state_dict``, ``save_vocabulary`` and the start of a
pass, not per batch.

Follow mode (``etl.loader.follow``) is one endless pass: its batches are keyed by the ``FollowPosition`` after
each, and the state at a saved ``FollowPosition`` (the position after the last batch handed out) is the
state after that batch. A restart resumes from it; its batches are those the stream gives from that position
(where idle flushes cut buffers depends on time, as the rows do not), each given its ids in order from that state.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from etl.errors import ArtifactError, ConfigError, LoaderError
from etl.io.arrow import from_numpy, to_numpy
from etl.io.fs import Location
from etl.loader.chunk import ChunkRun
from etl.ops import Categorify
from etl.ops.base import InvalidState
from etl.ops.online_vocab import Undo, VocabEvents, canonical_state
from etl.pipeline import Pipeline, artifacts

#: The state of every online column: ``OnlineVocab.export`` by column name.
State = dict[str, dict[str, Any]]
#: A position whose state the vocabularies keep: a batch position (epoch, batches before it), or in follow mode a
#: ``FollowPosition``.
Key = Hashable

#: The columns and types of an online vocabulary table (an artifact), sorted by key; ``id`` -1: a candidate.
TABLE_SCHEMA = pa.schema([("key", pa.uint64()), ("count", pa.int64()), ("last", pa.int64()), ("id", pa.int64())])
_ARRAYS = {"key": np.uint64, "count": np.int64, "last": np.int64, "id": np.int64}


@dataclass
class _Step:
    """One batch applied in the current pass: the key of the position after it (None until the assembler names
    it) and, per column, what the batch changed (``Undo``)."""

    key: Key | None
    undo: dict[str, Undo]


class OnlineVocabularies:
    """The online vocabularies of a loader (one per online column, in ``columns`` order: the layout's
    ``online``), the state a pass starts from (``base``), and the way back from the vocabularies' current state to
    the state at any position between the consumer and the assembler (see the module docstring, State)."""

    def __init__(self, pipeline: Pipeline, columns: list[str], sparse: list[str]):
        by_column = {c: op for op in pipeline.ops if isinstance(op, Categorify) for c in op.columns}
        self.columns = columns
        self.vocabs = {c: by_column[c].online_vocab(c) for c in columns}
        self.sparse_index = [sparse.index(c) for c in columns]
        self.base: State = self._export()
        self._floor: Key | None = None  # the oldest position of the current pass whose state can be produced
        self._steps: list[_Step] = []  # the batches applied after it, oldest first
        self._at_base = True  # the vocabularies hold base (a pass starts without restoring it)
        self._lost = False  # an update (or a restore) failed midway: no state of the current pass can be made
        # Two locks, always taken in this order: ``_tables`` while the vocabularies' tables are read or changed (an
        # update runs under it), ``_lock`` while the steps change. The consumer's ``prune`` (every batch) takes only
        # ``_lock``, so it never waits for the assembler's update of a later batch.
        self._tables = threading.Lock()
        self._lock = threading.Lock()

    def _export(self, undo: list[_Step] | None = None) -> State:
        """The vocabularies' state now, or before the steps ``undo`` (newest first)."""
        return {c: v.export(canonical=undo is None, undo=[s.undo[c] for s in undo or () if c in s.undo]) for c, v in self.vocabs.items()}

    def held(self) -> tuple[int, int]:
        """The positions whose state can be produced (the consumer's and one per batch in flight), and the bytes of
        the undo records that keeps."""
        with self._lock:
            return (0 if self._floor is None else 1 + len(self._steps)), sum(u.nbytes for s in self._steps for u in s.undo.values())

    # ------------------------------------------------------------------ the assembler's side
    def start_pass(self, key: Key) -> OnlinePass:
        """Set the vocabularies to ``base`` for a pass starting at ``key`` (restoring it unless they hold it: a
        restored vocabulary behaves as the one exported, see ``etl.ops.online_vocab``)."""
        with self._tables, self._lock:
            if not self._at_base:
                for c, v in self.vocabs.items():
                    v.restore(self.base[c])
            self._floor, self._steps, self._at_base = key, [], True
        return OnlinePass(self)

    def apply_step(self, update: Callable[[], dict[str, Undo]]) -> None:
        """Run ``update`` (one batch through the vocabularies, returning its undo records) as one step."""
        with self._tables:
            self._at_base = False
            try:
                undo = update()
            except BaseException:
                self._lost = True
                raise
            with self._lock:
                self._steps.append(_Step(None, undo))

    def name_step(self, key: Key) -> None:
        """The state after the steps so far is the state at ``key``."""
        with self._lock:
            if self._steps and self._steps[-1].key is None:
                self._steps[-1].key = key
            else:  # a batch that changed nothing
                self._steps.append(_Step(key, {}))

    # ------------------------------------------------------------------ the consumer's side
    def _back_to(self, key: Key) -> list[_Step] | None:
        """The steps to undo (newest first) to reach the state at ``key``; None when the current pass does not hold
        it (both locks held). ``LoaderError`` after an update failed midway (until a state is loaded)."""
        if self._lost:
            raise LoaderError("the online vocabularies' state is unknown after an update failed: load a saved state "
                              "(load_state_dict, load_vocabulary) to continue")  # fmt: skip
        if self._floor is None:
            return None
        if key == self._floor:
            return self._steps[::-1]
        for i in range(len(self._steps) - 1, -1, -1):
            if self._steps[i].key == key:
                return self._steps[:i:-1]
        return None

    def at(self, key: Key) -> State:
        """The state at ``key``: produced from the current state and the undo records of the batches after it, or
        ``base`` when the current pass does not hold it (no pass reached it)."""
        with self._tables, self._lock:
            undo = self._back_to(key)
            return self.base if undo is None else self._export(undo)

    def commit(self, key: Key) -> None:
        """Make the state at ``key`` the one the next pass starts from (and forget the current pass's steps)."""
        with self._tables, self._lock:
            undo = self._back_to(key)
            if undo is not None:
                self.base = self._export(undo)
                self._at_base = not undo  # the state at key is the current one
            self._floor, self._steps = None, []

    def prune(self, key: Key) -> None:
        """Forget the steps up to ``key`` (the consumer is past them): the state at ``key`` is the oldest held."""
        with self._lock:
            for i, step in enumerate(self._steps):
                if step.key == key:
                    self._floor, self._steps = key, self._steps[i + 1 :]
                    return

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
        """Check ``state`` against every vocabulary, then restore each and make it ``base``. Refused, nothing changes:
        the state at the loader's position is still the one it had."""
        with self._tables, self._lock:
            for c, v in self.vocabs.items():
                try:
                    v.check(state[c])
                except InvalidState as e:
                    raise error(c, e) from None
            # until every column is restored, the vocabularies hold no state that could be given
            self._floor, self._steps, self._at_base, self._lost = None, [], False, True
            for c, v in self.vocabs.items():
                v.restore(state[c])
            self.base, self._at_base, self._lost = self._export(), True, False

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
    """One pass's use of the vocabularies, from the assembler thread: ``apply`` to each batch as it is gathered
    into its ring slot, in the pass's batch order, then ``name_step`` with the key of the position after it."""

    def __init__(self, vocabs: OnlineVocabularies):
        self.vocabs = vocabs
        self.threads = max(1, min(len(vocabs.columns), os.cpu_count() or 1))

    def apply(self, parts: list[tuple[ChunkRun, np.ndarray]], sparse: np.ndarray) -> dict[str, VocabEvents]:
        """Give ids to the rows of one batch (``parts``: buffers and their rows, in the batch's row order) in
        ``sparse`` (the batch's sparse ids, one row per batch row) and return the batch's events. Several columns
        are updated on the threads of a pool that lives for this call (the kernels release the GIL); each column's
        rows go through its vocabulary in order."""
        v = self.vocabs
        if not parts:
            return {c: VocabEvents.none() for c in v.columns}
        fields = _gather_keys(parts, v.columns)

        def update(c: str) -> tuple[np.ndarray, VocabEvents, Undo]:
            return v.vocabs[c].update_with_undo(fields[f"online_keys:{c}"], fields[f"online_valid:{c}"])

        results: list[tuple[np.ndarray, VocabEvents, Undo]] = []

        def update_all() -> dict[str, Undo]:
            if self.threads == 1:
                results.extend(update(c) for c in v.columns)
            else:
                with ThreadPoolExecutor(self.threads, thread_name_prefix="etl-online-vocab") as pool:
                    results.extend(pool.map(update, v.columns))
            return {c: undo for c, (_, _, undo) in zip(v.columns, results)}

        v.apply_step(update_all)
        events = {}
        for c, (ids, ev, _), j in zip(v.columns, results, v.sparse_index):
            sparse[:, j] = ids  # here, not in the threads: they would share the rows' cache lines
            events[c] = ev
        return events

    def name_step(self, key: Hashable) -> None:
        """The state after the batches applied so far is the state at ``key``."""
        self.vocabs.name_step(key)


def _gather_keys(parts: list[tuple[ChunkRun, np.ndarray]], columns: list[str]) -> dict[str, np.ndarray]:
    """The fields ``online_keys:<column>`` and ``online_valid:<column>`` of every column for the rows of ``parts``,
    in order: one gather of each part's rows for all the fields."""
    n = sum(len(rows) for _, rows in parts)
    out = {f"online_{what}:{c}": np.empty(n, dtype) for c in columns for what, dtype in (("keys", np.uint64), ("valid", np.bool_))}
    row = 0
    for buf, rows in parts:
        buf.gather(rows, {name: a[row : row + len(rows)] for name, a in out.items()})
        row += len(rows)
    return out
