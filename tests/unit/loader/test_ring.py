"""etl.loader.ring on CPU: the acquire → fill → view → release cycle, slot reuse, stopping while no slot is free."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from etl.loader.ring import Field, Ring

FIELDS = [Field("label", (), torch.float32), Field("dense", (3,), torch.float32), Field("sparse", (2,), torch.int64)]


def _arrays(n: int, base: int) -> dict[str, np.ndarray]:
    return {
        "label": np.arange(base, base + n, dtype=np.float32),
        "dense": np.arange(base, base + 3 * n, dtype=np.float32).reshape(n, 3),
        "sparse": np.arange(base, base + 2 * n, dtype=np.int64).reshape(n, 2),
    }


def _ring(slots: int = 3, batch: int = 8) -> Ring:
    return Ring(slots, batch, FIELDS, torch.device("cpu"))


def test_slots_are_preallocated_with_the_fields_shapes() -> None:
    r = _ring(3, 8)
    assert not r.cuda and r.stream is None
    assert len(r.host) == 3 and r.dev is r.host  # on CPU the host tensors are what the consumer sees
    for slot in r.host:
        assert slot["label"].shape == (8,) and slot["dense"].shape == (8, 3) and slot["sparse"].shape == (8, 2)
        assert slot["sparse"].dtype == torch.int64 and slot["label"].device.type == "cpu"
        assert not slot["label"].is_pinned()  # no CUDA target: never pinned (pinning raises on CPU-only builds)
    ptrs = {t.data_ptr() for slot in r.host for t in slot.values()}
    assert len(ptrs) == 9  # no two slots or fields share storage


def test_acquire_fill_view_release_cycle_reuses_slots() -> None:
    r = _ring(3, 8)
    stop = threading.Event()
    ptrs: dict[int, tuple[int, ...]] = {}
    seen = []
    for cycle in range(10):
        n = 1 + cycle % 8  # partial batches too
        slot = r.acquire(stop)
        assert slot in (0, 1, 2)
        seen.append(slot)
        arrays = _arrays(n, 100 * cycle)
        r.fill(slot, arrays, n)
        r.ship(slot, n)  # a no-op on CPU
        view = r.view(slot, n)
        assert set(view) == {"label", "dense", "sparse"}
        for k, a in arrays.items():
            assert view[k].shape[0] == n
            np.testing.assert_array_equal(view[k].numpy(), a)
        key = tuple(view[k].data_ptr() for k in ("label", "dense", "sparse"))
        assert ptrs.setdefault(slot, key) == key, "a slot must keep its storage from cycle to cycle"
        r.release(slot)
    assert set(seen) <= {0, 1, 2} and len(ptrs) <= 3


def test_fill_overwrites_only_the_first_n_rows_and_view_is_not_a_copy() -> None:
    r = _ring(1, 8)
    stop = threading.Event()
    s = r.acquire(stop)
    r.fill(s, _arrays(8, 0), 8)
    r.release(s)
    s2 = r.acquire(stop)
    assert s2 == s
    r.fill(s2, _arrays(3, 1000), 3)
    v = r.view(s2, 3)
    np.testing.assert_array_equal(v["label"].numpy(), [1000, 1001, 1002])
    assert r.host[s2]["label"][3:].tolist() == [3, 4, 5, 6, 7]  # rows past n are left as they were
    assert v["label"].data_ptr() == r.host[s2]["label"].data_ptr()


def test_all_slots_can_be_held_at_once_and_a_released_slot_comes_back() -> None:
    r = _ring(3, 4)
    stop = threading.Event()
    held = [r.acquire(stop) for _ in range(3)]
    assert sorted(held) == [0, 1, 2]
    got = []
    t = threading.Thread(target=lambda: got.append(r.acquire(stop)))
    t.start()
    time.sleep(0.2)
    assert t.is_alive() and got == []  # blocks while every slot is held
    r.release(held[1])
    t.join(5)
    assert got == [held[1]]


def test_acquire_returns_none_once_stop_is_set_while_no_slot_is_free() -> None:
    r = _ring(2, 4)
    stop = threading.Event()
    assert r.acquire(stop) is not None and r.acquire(stop) is not None
    got = []
    t = threading.Thread(target=lambda: got.append(r.acquire(stop)))
    t.start()
    time.sleep(0.15)
    assert t.is_alive()
    t0 = time.perf_counter()
    stop.set()
    t.join(5)
    assert not t.is_alive() and got == [None]
    assert time.perf_counter() - t0 < 2
    # with stop already set, acquire does not hand out a slot even if one is free
    r.release(0)
    assert r.acquire(stop) is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_ring_copies_to_the_device() -> None:
    r = Ring(2, 8, FIELDS, torch.device("cuda"))
    assert r.host[0]["label"].is_pinned() and r.dev[0]["label"].is_cuda
    stop = threading.Event()
    for cycle in range(5):
        s = r.acquire(stop)
        a = _arrays(5, cycle * 10)
        r.fill(s, a, 5)
        r.ship(s, 5)
        v = r.view(s, 5)
        for k in a:
            assert v[k].is_cuda
            np.testing.assert_array_equal(v[k].cpu().numpy(), a[k])
        r.release(s)
