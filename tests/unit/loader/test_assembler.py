"""etl.loader.assembler on a CPU ring, fed by the fake source of ``fakes`` (rows that hold their own numbers).

The reference below is the module docstring's rule, brute force."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from etl.loader.assembler import Assembler, InlineExecutor, PassSettings
from etl.loader.order import epoch_rng, rank_pieces
from etl.loader.ring import Ring
from etl.loader.stats import LoaderStats
from tests.unit.loader.fakes import FIRST, GROUPS, LAYOUT, fake_read, settings


def assemble(s: PassSettings, inline: bool = False) -> tuple[list[np.ndarray], LoaderStats, threading.Event]:
    """Run the assembler to its end (a slot and queue room for every batch); the rows of each batch. ``inline``:
    read the pieces in this thread (``InlineExecutor``) instead of a pool of two."""
    ring = Ring(s.total + 1, s.batch_size, LAYOUT.batch_fields(), torch.device("cpu"))
    ready: queue.Queue = queue.Queue()
    stats, all_submitted = LoaderStats(), threading.Event()
    with InlineExecutor() if inline else ThreadPoolExecutor(2) as pool:
        asm = Assembler(s, GROUPS, fake_read, pool, ring, stats, read_ahead=3, stop=threading.Event(),
                        all_submitted=all_submitted, empty=LAYOUT.empty())  # fmt: skip
        assert asm.run(ready)
    batches = []
    while not ready.empty():
        slot, n, lists, check, events = ready.get_nowait()
        assert check is None and events == {}  # host placement: nothing is checked on the device
        t = ring.view(slot, n)
        rows = t["sparse"][:, 0].numpy().copy()
        assert np.array_equal(t["label"].numpy(), rows.astype(np.float32))
        assert np.array_equal(t["dense"][:, 0].numpy(), rows.astype(np.float32))
        values, offsets = lists["g"]
        assert np.array_equal(values.numpy(), np.repeat(rows, rows % 3)) and offsets.tolist()[0] == 0
        assert np.array_equal(np.diff(offsets.numpy()), rows % 3)
        batches.append(rows)
    return batches, stats, all_submitted


def reference(s: PassSettings) -> list[np.ndarray]:
    """The rows of every batch of the pass, from batch 0: the rank's pieces in order, permuted per buffer."""
    pieces = rank_pieces(GROUPS, seed=s.seed, epoch=s.epoch, shuffle=s.shuffle, rank=s.rank, world_size=s.world_size)
    rows = np.concatenate([FIRST[p.group] + p.start + np.arange(p.length) for p in pieces])
    stream = []
    for no, a in enumerate(range(0, len(rows), s.shuffle_buffer)):
        buf = rows[a : a + s.shuffle_buffer]
        stream.append(buf[epoch_rng(s.seed, s.epoch, s.rank, no).permutation(len(buf))] if s.shuffle else buf)
    stream = np.concatenate(stream)
    return [stream[i * s.batch_size : (i + 1) * s.batch_size] for i in range(s.total)]


def test_without_shuffle_batches_are_consecutive_rows_and_the_last_is_short() -> None:
    batches, stats, all_submitted = assemble(settings(60, 100, shuffle=False))
    assert [len(b) for b in batches] == [60] * 5 + [20]
    assert np.array_equal(np.concatenate(batches), np.arange(320))
    assert all_submitted.is_set() and stats.assemble_seconds > 0


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("batch_size, shuffle_buffer", [(64, 100), (50, 50), (32, 1000), (100, 7)])
def test_with_shuffle_batches_follow_the_buffers_permutations(batch_size: int, shuffle_buffer: int, inline: bool) -> None:
    s = settings(batch_size, shuffle_buffer, shuffle=True)
    batches = assemble(s, inline)[0]
    want = reference(s)
    assert len(batches) == len(want) == s.total
    assert all(np.array_equal(b, w) for b, w in zip(batches, want))
    assert sorted(np.concatenate(batches).tolist()) == list(range(320))
    assert not np.array_equal(np.concatenate(batches), np.arange(320))


@pytest.mark.parametrize("start", [1, 2, 3, 5])
def test_a_pass_from_batch_start_yields_the_rest_of_the_full_pass(start: int) -> None:
    """Batch ``start`` begins inside a shuffle buffer (100 rows, batches of 64): the buffer is re-read and cut."""
    full = assemble(settings(64, 100, shuffle=True))[0]
    rest = assemble(settings(64, 100, shuffle=True, start=start))[0]
    assert len(rest) == len(full) - start
    assert all(np.array_equal(a, b) for a, b in zip(rest, full[start:]))


@pytest.mark.parametrize("rank, sizes", [(0, [53, 53, 0]), (1, [53, 53, 1]), (2, [53, 53, 1])])
def test_a_rank_ends_with_its_short_batch_or_the_empty_batch_it_owes(rank: int, sizes: list[int]) -> None:
    """320 rows over 3 ranks: 106, 107 and 107 rows; every rank yields ceil(107 / 53) = 3 batches."""
    s = settings(53, 50, shuffle=True, rank=rank, world_size=3)
    batches = assemble(s)[0]
    assert [len(b) for b in batches] == sizes
    assert all(np.array_equal(b, w) for b, w in zip(batches, reference(s)))
