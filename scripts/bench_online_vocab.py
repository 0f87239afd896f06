#!/usr/bin/env python3
"""Online vocabulary throughput (Categorify ``online: true``), in one run, on a synthetic Criteo-like set.

1. The state machine alone (``etl.ops.online_vocab``): the keys of every categorical column (decoded once),
   fed column by column in batches of ``--piece`` rows (one update each), in one thread; rows/s (a row: one key
   of each column) of CPU, per eviction policy, and ns of CPU per key by cardinality class of the column; plus
   the size and cost of a state of every column (``export(canonical=False)``, made on demand: ``state_dict``,
   start of a pass) and the size of the undo records of one update of every column (the loader keeps one per
   batch in flight). (The loader updates the columns on parallel threads.) The tables start as untouched zero
   pages, so this first pass over the stream also pays their page faults (a loader pays them in its first epoch).
2. The Loader, one shuffled epoch, with the same pipeline with offline Categorify and with online Categorify on
   every categorical column, back to back (best of ``--repeat``): rows/s and CPU seconds of the process, and the
   most positions and undo bytes the online vocabularies held.

    python scripts/bench_online_vocab.py --data /tmp/g2m --capacity 100000 --admit-after 3 --repeat 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from etl.io.parquet import list_shards, open_shard
from etl.loader import Loader
from etl.ops.online_vocab import OnlineVocab
from etl.pipeline import Pipeline

REPO = Path(__file__).resolve().parents[1]


def keys_of(data: Path, pipeline: Pipeline) -> dict[str, np.ndarray]:
    """The decoded keys of every categorical column over all shards, in shard order."""
    decode = [op for op in pipeline.ops if op.name == "Decode"]
    parts: dict[str, list[np.ndarray]] = {}
    for path in list_shards([data]):
        shard = open_shard(path, pipeline.schema)
        for i in range(shard.num_row_groups):
            batch = shard.read(i, decode[0].columns)
            batch = pipeline.run_ops(batch, decode, "raise", labels=False, output=False).batch
            for c in decode[0].columns:
                col = batch[c]
                keys = col.array.view(np.uint64).copy()
                if col.valid is not None:
                    keys[~col.valid] = 0
                parts.setdefault(c, []).append(keys)
    return {c: np.concatenate(p) for c, p in parts.items()}


def cardinality_class(keys: np.ndarray) -> str:
    """``high`` (200 000 distinct keys or more), ``mid`` (10 000 or more) or ``low``."""
    distinct = len(np.unique(keys))
    return "high" if distinct >= 200_000 else "mid" if distinct >= 10_000 else "low"


def bench_state_machine(keys: dict[str, np.ndarray], capacity: int, admit_after: int, piece: int) -> None:
    n = len(next(iter(keys.values())))
    classes = {c: cardinality_class(k) for c, k in keys.items()}
    warm = OnlineVocab(16, 1)  # compiled (or loaded from numba's cache) before the clock starts
    warm.update(np.arange(64, dtype=np.uint64))
    warm.update_with_undo(np.arange(64, dtype=np.uint64))
    for evict, ttl in (("lfu", None), ("ttl", n // 4)):
        vocabs = {c: OnlineVocab(capacity, admit_after, evict, ttl) for c in keys}
        cpu = dict.fromkeys(keys, 0.0)
        admitted = evicted = 0
        for a in range(0, n, piece):
            for c, v in vocabs.items():
                c0 = time.process_time()
                _, ev = v.update(keys[c][a : a + piece])
                cpu[c] += time.process_time() - c0
                admitted += len(ev.admitted_ids)
                evicted += len(ev.evicted_ids)
        total = sum(cpu.values())
        print(f"state machine {evict:>3}: {n:,} rows x {len(keys)} columns: {n / total:,.0f} rows/s of CPU, {admitted:,} admitted, "
              f"{evicted:,} evicted")  # fmt: skip
        for k in ("high", "mid", "low"):
            cols = [c for c in keys if classes[c] == k]
            if cols:
                ns = [cpu[c] * 1e9 / n for c in cols]
                print(f"    {k:>4} cardinality ({len(cols)} columns): {sum(ns) / len(ns):6.1f} ns/key on average, {min(ns):.1f} .. {max(ns):.1f}")
        c0 = time.process_time()
        states = [v.export(canonical=False) for v in vocabs.values()]
        made = time.process_time() - c0
        size = sum(a.nbytes for s in states for a in s.values() if isinstance(a, np.ndarray))
        undo = sum(v.update_with_undo(keys[c][:piece])[2].nbytes for c, v in vocabs.items())
        print(f"    a state of every column: {size / 1e6:.0f} MB, made in {made * 1000:.0f} ms CPU; the undo records of one update of "
              f"{piece:,} rows, every column: {undo / 1e6:.0f} MB")  # fmt: skip


def bench_loader(data: Path, capacity: int, admit_after: int, repeat: int, batch_size: int, workers: int) -> None:
    base = yaml.safe_load((REPO / "pipelines/criteo.yaml").read_text())
    base["schema"] = str(REPO / "schemas/criteo.yaml")
    online = yaml.safe_load(yaml.safe_dump(base))
    online["ops"][-1] = {"op": "Categorify", "columns": "@categorical", "freq_threshold": 3, "online": True, "capacity": capacity,
                         "admit_after": admit_after}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-online-") as tmp:
        loaders = {}
        for name, doc in (("offline", base), ("online", online)):
            path = Path(tmp) / f"{name}.yaml"
            path.write_text(yaml.safe_dump(doc))
            p = Pipeline.from_file(path)
            p.fit(list_shards([data]), workers=workers)
            p.save(Path(tmp) / name)
            loaders[name] = Loader(data, pipeline=path, artifacts=Path(tmp) / name, batch_size=batch_size, shuffle=True, num_workers=workers)
        best: dict[str, tuple[float, float]] = {}
        held = undo_bytes = 0
        for r in range(repeat):
            for name, ld in loaders.items():
                ld.set_epoch(r)
                c0, w0, rows = time.process_time(), time.perf_counter(), 0
                for b in ld:
                    rows += len(b)
                    if ld.streams is not None:
                        positions, undo = ld.streams.held()
                        held = max(held, positions)
                        undo_bytes = max(undo_bytes, undo)
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                prev = best.get(name, (float("inf"), float("inf")))
                best[name] = (min(prev[0], wall), min(prev[1], cpu))
        for name, (wall, cpu) in best.items():
            print(f"loader {name:>7}: {rows / wall:,.0f} rows/s wall, {cpu:.1f} s CPU per epoch of {rows:,} rows (best of {repeat})")
        print(f"online / offline: wall x{best['online'][0] / best['offline'][0]:.2f}, CPU x{best['online'][1] / best['offline'][1]:.2f}")
        print(f"online: at most {held} positions held, their undo records at most {undo_bytes / 1e6:.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="raw Criteo-like shards (etl generate --schema schemas/criteo.yaml)")
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--admit-after", type=int, default=3)
    ap.add_argument("--piece", type=int, default=131_072, help="rows per update (a loader batch)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=65536)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-loader", action="store_true", help="measure the state machine only")
    args = ap.parse_args()
    pipeline = Pipeline.from_file(REPO / "pipelines/criteo.yaml")
    bench_state_machine(keys_of(args.data, pipeline), args.capacity, args.admit_after, args.piece)
    if not args.skip_loader:
        bench_loader(args.data, args.capacity, args.admit_after, args.repeat, args.batch_size, args.workers)


if __name__ == "__main__":
    main()
