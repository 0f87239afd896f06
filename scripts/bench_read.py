#!/usr/bin/env python3
"""Parquet read throughput of the raw layout, row group by row group: pyarrow vs polars (the reader etl uses).

For each engine and thread count, every row group of every shard is read into Arrow (the form the transform
consumes), all columns or only the categorical ones; the best of ``--repeat`` runs is reported in rows/s.

    python scripts/bench_read.py /tmp/bench-data --repeat 3
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from etl.io.parquet import list_shards


def row_groups(files: list[Path]) -> list[tuple[Path, int, int, int]]:
    out = []
    for f in files:
        meta = pq.ParquetFile(f).metadata
        start = 0
        for i in range(meta.num_row_groups):
            n = meta.row_group(i).num_rows
            out.append((f, i, start, n))
            start += n
    return out


def read_pyarrow(items, columns) -> None:
    files = {}
    for f, i, _, _ in items:
        pf = files.setdefault(f, pq.ParquetFile(f))
        pf.read_row_group(i, columns=columns, use_threads=False)


def read_polars(items, columns) -> None:
    for f, _, start, n in items:
        pl.scan_parquet(f).select(columns).slice(start, n).collect().to_arrow(compat_level=pl.CompatLevel.newest())


def run(fn, items, columns, threads: int) -> float:
    parts = [items[t::threads] for t in range(threads)]
    t0 = time.perf_counter()
    workers = [threading.Thread(target=fn, args=(p, columns)) for p in parts]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    files = list_shards(args.data)
    items = row_groups(files)
    rows = sum(n for *_, n in items)
    schema = pq.ParquetFile(files[0]).schema_arrow
    all_cols = schema.names
    string_cols = [f.name for f in schema if str(f.type) in ("string", "large_string")]
    print(f"{rows:,} rows in {len(items)} row groups; best of {args.repeat}")
    print(f"{'engine':8s} {'columns':12s} {'threads':>7s} {'rows/s':>12s}")
    for name, fn in (("pyarrow", read_pyarrow), ("polars", read_polars)):
        for label, cols in (("all", all_cols), ("categorical", string_cols)):
            for threads in (1, 2):
                best = min(run(fn, items, cols, threads) for _ in range(args.repeat))
                print(f"{name:8s} {label:12s} {threads:7d} {rows / best:12,.0f}")


if __name__ == "__main__":
    main()
