"""``LoaderStats``: where a loader's time goes, counted by its threads while it runs."""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields


@dataclass
class LoaderStats:
    """Seconds spent per stage (summed over threads) and how long the consumer waited in ``next()``.

    Locking rule: the reader workers, the assembler and the consumer run on different threads, so every change
    goes through an ``add_*`` method, which holds the stats' own lock. Reading a field gives its latest value;
    ``as_dict`` gives a snapshot of all of them taken under the lock."""

    batches: int = 0
    rows: int = 0
    wait_seconds: float = 0.0
    consumer_seconds: float = 0.0  # per pass, from its first next() to its last batch returned; summed over passes
    read_seconds: float = 0.0
    transform_seconds: float = 0.0
    assemble_seconds: float = 0.0
    copy_seconds: float = 0.0  # host→device copy, and the device transform's launch with transform_on="device"
    #: keys the streaming History states evicted (``max_keys``, least recently seen first), counted as batches are
    #: assembled: a batch assembled again (a resumed or restarted pass) counts again
    history_evictions: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add_read(self, read: float, transform: float) -> None:
        """A worker read one piece in ``read`` seconds and transformed it in ``transform`` seconds."""
        with self._lock:
            self.read_seconds += read
            self.transform_seconds += transform

    def add_assemble(self, assemble: float, copy: float = 0.0) -> None:
        """The assembler spent ``assemble`` seconds buffering rows or gathering a batch into a slot, and ``copy``
        seconds starting the slot's host→device copy."""
        with self._lock:
            self.assemble_seconds += assemble
            self.copy_seconds += copy

    def add_evictions(self, keys: int) -> None:
        """The streaming History states evicted ``keys`` keys while the assembler gave a batch its histories."""
        with self._lock:
            self.history_evictions += keys

    def add_batch(self, rows: int, wait: float, elapsed: float) -> None:
        """The consumer got a batch of ``rows`` rows after waiting ``wait`` seconds for it, ``elapsed`` seconds
        (wait included) after the previous batch of the same pass was returned (or the pass's first ``next()``)."""
        with self._lock:
            self.wait_seconds += wait
            self.batches += 1
            self.rows += rows
            self.consumer_seconds += elapsed

    @property
    def data_wait_fraction(self) -> float:
        """Share of the consumer's time spent waiting for data, over every pass so far (at most 1: each wait
        is part of the elapsed time it is counted in)."""
        return self.wait_seconds / self.consumer_seconds if self.consumer_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self)} | {"data_wait_fraction": self.data_wait_fraction}
