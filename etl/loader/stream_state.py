"""Streaming states in the loader (``etl.ops.stream``: online vocabularies, Categorify ``online: true``): where
their values are given, and how their state follows the loader's position. The loader knows no op: it drives every
state through the ``StreamState`` contract.

Where: the worker threads run every op but those with streaming states, and pass the columns the states read
through raw (``Chunk.carried``, see ``etl.loader.chunk``); the assembler thread, when it gathers a batch into its
ring slot (after shuffling), gathers those columns too and runs them through the states (``StreamState.advance``)
in the batch's row order, one update per batch, and writes what the states give into the slot's ``dense`` or
``sparse`` columns before the slot's copy starts. The batches are a function of the data, seed and settings
whatever the number of workers, so the values are too, and the same when a pass resumes.

Events: a batch carries exactly the events its own rows made (``LoaderBatch.vocab_events``: an online
vocabulary's admissions and evictions). An id evicted in batch ``b`` is given again at the earliest in batch
``b + 1`` (``OnlineVocab``'s deferred reuse), so within a batch an id names one key, and a trainer that resets the
embedding rows of a batch's ``admitted_ids`` before its step is exact: no row of the evicted key uses the id in or
after the batch that admits the new key.

State: the state at batch position ``p`` of an epoch is the state after its first ``p`` batches (the first batch
of a pass starts from ``base``). The assembler runs ahead of the consumer, so the state at any position between
them must remain available. The states hold the state after the last batch assembled, and each batch also
records what it changed (its undo record: for an online vocabulary, every table entry it changed, as it was
before), kept until the consumer is past the batch; the state at a position is the current one with the records of
the batches after it laid over it, newest first, made only when asked for. The loader's state (``state_dict``,
``save_vocabulary``) is the state at the consumer's position, saved with the op, column and parameters that made
each state (``etl.pipeline.saved_streams``): the state a resumed pass starts from, which then gives the remaining
batches the values and events of an uninterrupted run. A pass closed early leaves the states at that same state
(batches assembled but never delivered do not count). A pass restores ``base`` into the states only when they do
not hold it already (they do after a pass that ran to its end).

Memory (online vocabularies): ``base`` (one state: at most ``2 * capacity`` entries of 32 bytes per column), and
per batch assembled and not yet consumed (each holds a ring slot: at most ``prefetch + 2``) 40 bytes per entry it
changed and per column: at most twice its rows and at most ``2 * capacity`` (about one per row on a column whose
keys are mostly new, a few on a column of a few keys). Making a state copies each column's table once (``2 *
capacity`` entries of 32 bytes) while the assembler waits for the copy; that happens at ``state_dict``,
``save_vocabulary`` and the start of a pass, not per batch.

Follow mode (``etl.loader.follow``) is one endless pass: its batches are keyed by the ``FollowPosition`` after
each, and the state at a saved ``FollowPosition`` (the position after the last batch handed out) is the
state after that batch. A restart resumes from it; its batches are those the stream gives from that position
(where idle flushes cut buffers depends on time, as the rows do not), each given its values in order from that
state.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from etl.batch import Column
from etl.errors import ArtifactError, ConfigError, EtlError, LoaderError
from etl.io.fs import Location
from etl.loader.stats import LoaderStats
from etl.ops.base import InvalidState, Op
from etl.ops.stream import Carried, StreamInput, StreamState, StreamStep, UndoRecord, describe_specs
from etl.pipeline import saved_streams
from etl.pipeline.saved_streams import State

#: A position whose state the states keep: a batch position (epoch, batches before it), or in follow mode a
#: ``FollowPosition``.
Key = Hashable


@dataclass
class _Step:
    """One batch applied in the current pass: the key of the position after it (None until the assembler names
    it) and, per state, what the batch changed."""

    key: Key | None
    undo: dict[str, UndoRecord]


class StreamStates:
    """The streaming states of a loader (by name), the state a pass starts from (``base``), and the way back from
    the states' current state to the state at any position between the consumer and the assembler (see the module
    docstring, State). ``fields``: where each column the states write goes in a batch (``Layout.stream_fields``)."""

    def __init__(self, states: dict[str, StreamState], fields: dict[str, tuple[str, int]]):
        self.states, self.fields = states, fields
        self.specs = {n: s.spec for n, s in states.items()}
        inputs: dict[str, StreamInput] = {}
        for i in (i for spec in self.specs.values() for i in spec.inputs):
            inputs.setdefault(i.column, i)
        self.inputs = tuple(inputs.values())
        self.base: State = self._export()
        self.initial = {n: self.base[n] for n, spec in self.specs.items() if spec.per_epoch}  # what each epoch starts these from
        self._floor: Key | None = None  # the oldest position of the current pass whose state can be produced
        self._steps: list[_Step] = []  # the batches applied after it, oldest first
        self._at_base = True  # the states hold base (a pass starts without restoring it)
        self._lost = False  # an update (or a restore) failed midway: no state of the current pass can be made
        # Two locks, always taken in this order: ``_tables`` while the states are read or changed (an update runs
        # under it), ``_lock`` while the steps change. The consumer's ``prune`` (every batch) takes only ``_lock``,
        # so it never waits for the assembler's update of a later batch.
        self._tables = threading.Lock()
        self._lock = threading.Lock()

    @classmethod
    def of(cls, ops: list[Op], fields: dict[str, tuple[str, int]]) -> StreamStates | None:
        """The streaming states of ``ops`` (each made from its op's fitted state), or None when they keep none."""
        states = {spec.name: op.new_stream_state(spec.name) for op in ops for spec in op.stream_specs()}
        return cls(states, fields) if states else None

    def describe(self) -> str:
        """What the states are, for messages: ``online vocabulary of 'C1' (Categorify), ...``."""
        return describe_specs(self.specs.values())

    def _export(self, undo: list[_Step] | None = None) -> State:
        """The states now, or before the steps ``undo`` (newest first)."""
        return {n: v.export(canonical=undo is None, undo=[s.undo[n] for s in undo or () if n in s.undo]) for n, v in self.states.items()}

    def held(self) -> tuple[int, int]:
        """The positions whose state can be produced (the consumer's and one per batch in flight), and the bytes of
        the undo records that keeps."""
        with self._lock:
            return (0 if self._floor is None else 1 + len(self._steps)), sum(u.nbytes for s in self._steps for u in s.undo.values())

    # ------------------------------------------------------------------ the assembler's side
    def start_pass(self, key: Key, epoch_start: bool = False, stats: LoaderStats | None = None) -> StreamPass:
        """Set the states to ``base`` for a pass starting at ``key`` (restoring it unless they hold it: a restored
        state behaves as the one exported); at the start of an epoch (``epoch_start``), the ``per_epoch`` states
        to the state they were made with instead (so that the state at the epoch's start is that one). The pass
        counts the keys the states evict in ``stats``, if given."""
        with self._tables, self._lock:
            fresh = self.initial if epoch_start else {}
            if not self._at_base or fresh:
                for n, v in self.states.items():
                    v.restore(fresh[n] if n in fresh else self.base[n])
            if fresh:
                self.base = self.base | fresh
            self._floor, self._steps, self._at_base = key, [], True
        return StreamPass(self, stats)

    def apply_step(self, update: Callable[[], dict[str, UndoRecord]]) -> None:
        """Run ``update`` (one batch through the states, returning their undo records) as one step."""
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
            raise LoaderError(f"the state of {self.describe()} is unknown after an update failed: load a saved state "
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

    # ------------------------------------------------------------------ saved states
    def _canonical(self, state: State) -> State:
        return {n: self.states[n].canonical(s) for n, s in state.items()}

    def to_dict(self, state: State) -> dict[str, Any]:
        """A state in its ``state_dict`` form (``etl.pipeline.saved_streams``: ints and bytes, no pickled objects)."""
        return saved_streams.to_dict(self._canonical(state), self.specs)

    def load_dict(self, saved: Mapping[str, Any]) -> None:
        """Take the states a loader's ``state_dict`` holds as ``base`` (``ConfigError`` when they are not states of
        these: other names, another op, column or parameters, or contents ``StreamState.check`` refuses)."""
        state = saved_streams.from_dict(saved, self.specs)
        self._take(state, lambda n, e: ConfigError(f"state_dict: {self.specs[n].describe()}: {e}"))

    def save(self, state: State, directory: str | Location) -> None:
        """Write ``state`` as artifacts (``etl.pipeline.saved_streams``): JSON + one Parquet table per state."""
        saved_streams.save(directory, self._canonical(state), self.specs)

    def load(self, directory: str | Location) -> None:
        """Take the states saved in ``directory`` as ``base`` (``ArtifactError`` naming the file when they are not
        states of these)."""
        state, tables = saved_streams.load(directory, self.specs)
        self._take(state, lambda n, e: ArtifactError(f"{tables[n]}: {e}"))

    def _take(self, state: State, error: Callable[[str, Exception], EtlError]) -> None:
        """Check ``state`` against every state, then restore each and make it ``base``. Refused, nothing changes: the
        state at the loader's position is still the one it had."""
        with self._tables, self._lock:
            for n, v in self.states.items():
                try:
                    v.check(state[n])
                except InvalidState as e:
                    raise error(n, e) from None
            # until every state is restored, the states hold no state that could be given
            self._floor, self._steps, self._at_base, self._lost = None, [], False, True
            for n, v in self.states.items():
                v.restore(state[n])
            self.base, self._at_base, self._lost = self._export(), True, False


class StreamPass:
    """One pass's use of the states, from the assembler thread: ``apply`` to each batch as it is gathered into its
    ring slot, in the pass's batch order, then ``name_step`` with the key of the position after it."""

    def __init__(self, streams: StreamStates, stats: LoaderStats | None = None):
        self.streams, self.stats = streams, stats
        self.threads = max(1, min(len(streams.states), os.cpu_count() or 1))

    def new_inputs(self, n: int) -> dict[str, Carried]:
        """Room for the carried columns of a batch of ``n`` rows, to gather them into (``ChunkRun.gather``)."""
        return {c: Carried(np.empty(n, dtype), np.empty(n, np.bool_)) for c, dtype in self.streams.inputs}

    def apply(self, inputs: dict[str, Carried], views: dict[str, np.ndarray], lists: dict[str, Column] | None = None) -> dict[str, Any]:
        """Run the rows of one batch (``inputs``: its carried columns, in the batch's row order) through the states,
        write what they give into the batch's fields ``views`` (one row per batch row) and its list columns into
        ``lists`` (values and offsets), and return the batch's events by state. Several states are updated on the
        threads of a pool that lives for this call (the online vocabulary's kernels release the GIL); each state
        takes the rows in order. A state's ``RowRejected`` is raised as it is (the caller knows where the row came
        from)."""
        h = self.streams
        names = list(h.states)
        results: list[StreamStep] = []

        def update_all() -> dict[str, UndoRecord]:
            if self.threads == 1:
                results.extend(h.states[n].advance(inputs) for n in names)
            else:
                with ThreadPoolExecutor(self.threads, thread_name_prefix="etl-stream-state") as pool:
                    results.extend(pool.map(lambda n: h.states[n].advance(inputs), names))
            return {n: r.undo for n, r in zip(names, results)}

        h.apply_step(update_all)
        evicted = sum(r.evicted for r in results)
        if evicted and self.stats is not None:
            self.stats.add_evictions(evicted)
        events = {}
        for n, r in zip(names, results):
            spec = h.specs[n]
            for column, values in r.outputs.items():  # here, not in the threads: they would share the rows' cache lines
                if column in spec.lengths:
                    offsets = np.zeros(len(r.outputs[spec.lengths[column]]) + 1, np.int64)
                    np.cumsum(r.outputs[spec.lengths[column]], out=offsets[1:])
                    if lists is not None:
                        lists[column] = Column(values, None, offsets)
                    continue
                field, j = h.fields[column]
                views[field][:, j] = values
            if r.events is not None:
                events[n] = r.events
        return events

    def name_step(self, key: Hashable) -> None:
        """The state after the batches applied so far is the state at ``key``."""
        self.streams.name_step(key)
