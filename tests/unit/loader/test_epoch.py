"""etl.loader.epoch.EpochPass on a CPU ring, fed by the fake source of ``fakes``: handing batches over, closing
midway, being dropped, waiting for an earlier pass, and a failed read reaching the consumer."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
import torch

from etl.errors import LoaderError
from etl.loader.chunk import Chunk
from etl.loader.epoch import EpochPass
from etl.loader.order import Piece
from etl.loader.pieces import guarded
from etl.loader.ring import Ring
from etl.loader.stats import LoaderStats
from tests.unit.loader.fakes import GROUPS, LAYOUT, fake_read, settings

PREFETCH = 2
SLOTS = PREFETCH + 2  # as the loader sizes its ring


def new_ring(batch_size: int) -> Ring:
    return Ring(SLOTS, batch_size, LAYOUT.batch_fields(), torch.device("cpu"))


def new_pass(ring: Ring, read=fake_read, after: threading.Event | None = None, io_bound: bool = False, **kw) -> EpochPass:
    s = settings(ring.host[0]["label"].shape[0], 50, shuffle=False, **kw)
    return EpochPass(s, GROUPS, read, ring, LoaderStats(), num_workers=2, prefetch=PREFETCH, empty=LAYOUT.empty(), after=after,
                     io_bound=io_bound)  # fmt: skip


def wait_until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_whole_pass_hands_over_every_row_once_and_sets_its_events() -> None:
    ring = new_ring(30)
    p = new_pass(ring)
    rows = []
    for _ in range(p.settings.total):
        slot, n = p.take()[:2]
        rows.append(ring.view(slot, n)["sparse"][:, 0].numpy().copy())
        p.release()
    assert np.array_equal(np.concatenate(rows), np.arange(320))
    assert wait_until(p.assembled.is_set) and p.all_submitted.is_set()
    p.close()
    assert ring.free.qsize() == SLOTS


def test_an_io_bound_pass_reads_every_piece_in_flight_at_once() -> None:
    """From object storage, the num_workers + prefetch pieces read ahead are read concurrently: here each read
    waits for all of them to have started, which only one thread per piece in flight lets happen."""
    in_flight = threading.Barrier(2 + PREFETCH)

    def read(piece: Piece) -> Chunk:
        if GROUPS.index(piece.group) < in_flight.parties:  # the first pieces, read ahead together
            in_flight.wait(timeout=5)  # raises BrokenBarrierError (the pass fails) if fewer reads overlap
        return fake_read(piece)

    ring = new_ring(30)
    p = new_pass(ring, read=read, io_bound=True)
    first, n = p.take()[:2]
    assert n == 30 and not in_flight.broken
    p.close()


def test_a_pass_closed_midway_stops_its_threads_and_gives_back_its_slots() -> None:
    ring = new_ring(10)  # 32 batches: far more than the slots
    p = new_pass(ring)
    p.take()
    assert wait_until(lambda: ring.free.empty() and p.ready.full())  # the assembler filled every slot, then waited
    assert p.thread.is_alive()
    p.close()
    assert not p.thread.is_alive()
    assert ring.free.qsize() == SLOTS and p.ready.empty()
    assert p.assembled.is_set()
    with pytest.raises(RuntimeError):
        p.pool.submit(print)  # the reader pool is shut down
    p.close()  # idempotent


def test_a_dropped_pass_stops_its_threads() -> None:
    p = new_pass(new_ring(10))
    p.take()
    thread = p.thread
    del p
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_a_pass_after_another_takes_slots_only_once_the_other_is_assembled() -> None:
    ring = new_ring(30)
    after = threading.Event()
    read = []
    p = new_pass(ring, read=lambda piece: read.append(piece) or fake_read(piece), after=after)
    assert wait_until(lambda: len(read) >= 2)  # it reads meanwhile...
    time.sleep(0.2)
    assert ring.free.qsize() == SLOTS and p.ready.empty()  # ...but takes no slot
    after.set()
    rows = 0
    for _ in range(p.settings.total):
        rows += p.take()[1]
        p.release()
    assert rows == 320
    p.close()


def test_a_failed_read_reaches_the_consumer_as_loader_error_naming_the_piece() -> None:
    bad = GROUPS[3]  # f1.parquet, row group 1: rows 225..230 of the pass

    def read(piece: Piece) -> Chunk:
        if piece.group == bad:
            raise RuntimeError("disk on fire")
        return fake_read(piece)

    ring = new_ring(30)
    p = new_pass(ring, read=guarded(read))
    got = 0
    with pytest.raises(LoaderError) as info:
        while True:
            got += p.take()[1]
            p.release()
    msg = str(info.value)
    assert "f1.parquet, row group 1, rows 0..5: RuntimeError: disk on fire" in msg, msg
    assert isinstance(info.value.__cause__, RuntimeError)
    assert 0 < got <= 225  # the batches before the failed piece came first
    assert not p.thread.is_alive() and ring.free.qsize() == SLOTS  # the error closed the pass
