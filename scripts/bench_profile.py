#!/usr/bin/env python3
"""Where the time goes, per core: every step of fit and of the transform path, one thread, on the same shards.

For each row group in turn (read from the files each time, as the loader and fit do), times: the Parquet read
(polars; its decoder may use a second core inside one call), Arrow → numpy views, each op of the pipeline, the
output checks, the loader's chunk layout, and what preprocess adds (typed Arrow table, Parquet encode + write to
memory, sha256); for the categorify pipeline also fit's counting per column group (KeyCounter.add) and finalize.
Then the loader's assembler steps on those chunks: shuffle buffers (``ChunkRun``) with their permutations, and the
gather of every batch into a ring slot. Best of ``--repeat`` passes per step, in wall seconds and in CPU seconds of
the process (``time.process_time``: polars' own reader threads included), and each step's share of the loader's
CPU time (read → chunk → slot). The sum is the work of one row on one core; with two cores and perfect overlap
the end-to-end rate is at most twice the "per core" figure.

Last, whether the loader's two worker threads overlap (the GIL is held by Python code, released by polars, numpy
loops and the numba kernels): the worker path (read → chunk) over every row group with one thread, then with two
(``etl.runtime.workers.run_workers``), best of ``--repeat``; and the same for the transform alone (tables already in
memory: no polars). A speed-up of 2× is perfect overlap; on a machine shared with other jobs it reads low.

    python scripts/bench_profile.py --data /tmp/g2m --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from etl.backends import cpu
from etl.io.parquet import batch_from_arrow, list_shards, read_rows
from etl.loader.chunk import Chunk, ChunkRun, Layout
from etl.loader.order import epoch_rng, row_groups
from etl.loader.ring import Ring
from etl.pipeline import Pipeline
from etl.runtime.allocator import tune_allocator
from etl.runtime.workers import run_workers

REPO = Path(__file__).resolve().parents[1]


class Clock:
    """Wall and process CPU seconds per named step, summed over calls of ``tick``."""

    def __init__(self) -> None:
        self.spent: dict[str, tuple[float, float]] = {}
        self.start()

    def start(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def tick(self, name: str) -> None:
        """Charge the time since the last tick (or ``start``) to ``name``."""
        wall, cpu_time = time.perf_counter(), time.process_time()
        w, c = self.spent.get(name, (0.0, 0.0))
        self.spent[name] = (w + wall - self.wall, c + cpu_time - self.cpu)
        self.wall, self.cpu = wall, cpu_time


def profile_transform(pipeline: Pipeline, groups: list, batch_size: int) -> dict[str, tuple[float, float]]:
    clock = Clock()
    layout = Layout.of(pipeline)
    chunks = []
    for g in groups:
        clock.start()
        table = read_rows(g.path, pipeline.schema.names, g.first_row, g.num_rows, g.index)
        clock.tick("read (polars)")
        batch = batch_from_arrow(table, pipeline.schema)
        clock.tick("columns (Arrow → numpy views)")
        for op in pipeline.ops:
            batch = batch.with_columns(op.transform(batch, pipeline.xp))
            clock.tick(f"op {op.name}")
        pipeline.check_output(batch)
        clock.tick("output checks")
        chunks.append(Chunk.from_batch(batch, layout))
        clock.tick("chunk (loader layout)")
        out = pipeline.to_arrow(batch)
        clock.tick("preprocess: typed Arrow table")
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, out.schema, use_dictionary=False, compression="none", write_statistics=False) as w:
            w.write_table(out)
        clock.tick("preprocess: Parquet encode")
        hashlib.sha256(memoryview(sink.getvalue())).hexdigest()
        clock.tick("preprocess: sha256")
    assemble(chunks, layout, batch_size, clock)
    return clock.spent


def assemble(chunks: list[Chunk], layout: Layout, batch_size: int, clock: Clock) -> None:
    """The assembler's work on ``chunks``, as ``etl.loader.assembler`` does it (shuffle buffers of 4 batches):
    buffers and their permutations, then every batch gathered into a slot of a CPU ring."""
    size = 4 * batch_size
    ring = Ring(1, batch_size, layout.batch_fields(), torch.device("cpu"))
    rows = np.cumsum([0] + [c.n for c in chunks])
    for no, a in enumerate(range(0, int(rows[-1]), size)):
        clock.start()
        b = min(a + size, int(rows[-1]))
        parts = [c.slice(max(a, lo) - lo, min(b, hi) - lo) for c, lo, hi in zip(chunks, rows, rows[1:]) if lo < b and hi > a]
        buf = ChunkRun(parts)
        order = epoch_rng(0, 0, 0, no).permutation(buf.n)
        clock.tick("loader: shuffle buffer + permutation")
        for i in range(0, buf.n, batch_size):
            slot = ring.acquire_free()
            batch_rows = order[i : i + batch_size]
            buf.gather(batch_rows, ring.write(slot, len(batch_rows)))
            ring.release(slot)
        clock.tick("loader: gather into a ring slot")


def worker_path(pipeline: Pipeline, layout: Layout, g) -> Chunk:
    """One row group read and turned into a chunk, as a loader worker does (``etl.loader.pieces.HostReader``)."""
    table = read_rows(g.path, pipeline.input_columns, g.first_row, g.num_rows, g.index)
    batch = batch_from_arrow(table, pipeline.schema, str(g.path), g.index, g.first_row, pipeline.input_columns)
    return Chunk.from_batch(pipeline.transform(batch).batch, layout)


def overlap(pipeline: Pipeline, groups: list, repeat: int) -> dict[str, tuple[float, float]]:
    """Seconds (best of ``repeat``) with one and with two threads: the worker path over every row group, and the
    transform alone (tables read beforehand)."""
    layout = Layout.of(pipeline)
    tables = [read_rows(g.path, pipeline.input_columns, g.first_row, g.num_rows, g.index) for g in groups]

    def transform(i: int) -> Chunk:
        g = groups[i]
        batch = batch_from_arrow(tables[i], pipeline.schema, str(g.path), g.index, g.first_row, pipeline.input_columns)
        return Chunk.from_batch(pipeline.transform(batch).batch, layout)

    def best(work, items: list, threads: int) -> float:
        runs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            run_workers(items, threads, lambda w, item, stop: work(item))
            runs.append(time.perf_counter() - t0)
        return min(runs)

    def read_transform(g) -> Chunk:
        return worker_path(pipeline, layout, g)

    return {
        "worker path (read → chunk)": (best(read_transform, groups, 1), best(read_transform, groups, 2)),
        "transform only (→ chunk)": (best(transform, list(range(len(groups))), 1), best(transform, list(range(len(groups))), 2)),
    }


def profile_fit(pipeline: Pipeline, groups: list) -> dict[str, tuple[float, float]]:
    """fit's work for a Decode + Categorify pipeline, one thread: read the needed columns, decode, count."""
    decode = next(op for op in pipeline.ops if op.name == "Decode")
    cat = next(op for op in pipeline.ops if op.name == "Categorify")
    columns = ["label", *cat.columns]
    stats = cat.new_stats(cpu)
    clock = Clock()
    for g in groups:
        clock.start()
        table = read_rows(g.path, columns, g.first_row, g.num_rows, g.index)
        clock.tick("fit: read label + categoricals")
        batch = batch_from_arrow(table, pipeline.schema, columns=columns)
        batch = batch.with_columns(decode.transform(batch, cpu))
        clock.tick("fit: columns + decode")
        for c in cat.columns:
            cat.partial_fit({c: stats[c]}, batch, cpu)
            size = stats[c]["counter"].size
            clock.tick("fit: count, columns of < 64 k keys" if size < 65536 else "fit: count, columns of >= 64 k keys")
    clock.start()
    cat.finalize(stats, cpu)
    clock.tick("fit: finalize (threshold, sort, vocabulary tables)")
    return clock.spent


def report(name: str, rows: int, best: dict[str, tuple[float, float]], repeat: int) -> None:
    """Print the table of one pipeline: every step, then the per-core totals."""
    in_loader = [k for k in best if not k.startswith(("preprocess", "fit"))]
    loader_cpu = sum(best[k][1] for k in in_loader)
    print(f"\n{name} pipeline, {rows:,} rows, one thread (best of {repeat})")
    print(f"{'step':52s} {'wall s':>8s} {'cpu s':>8s} {'M rows/s':>9s} {'loader cpu':>10s}")
    for k, (wall, cpu_time) in best.items():
        share = f"{100 * cpu_time / loader_cpu:9.1f}%" if k in in_loader else ""
        print(f"{k:52s} {wall:8.3f} {cpu_time:8.3f} {rows / wall / 1e6:9.1f} {share:>10s}")
    totals = {
        "per core: read → chunk → slot (the loader)": in_loader,
        "per core: read → Parquet + sha256 (preprocess)": [k for k in best if not k.startswith(("chunk", "loader", "fit"))],
        "per core: fit": [k for k in best if k.startswith("fit")],
    }
    for label, keys in totals.items():
        if keys:
            wall, cpu_time = sum(best[k][0] for k in keys), sum(best[k][1] for k in keys)
            print(f"{label:52s} {wall:8.3f} {cpu_time:8.3f} {rows / wall / 1e6:9.2f}")


def main() -> None:
    tune_allocator()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="raw Criteo-layout shards")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=65536, help="loader batch size (shuffle buffers of 4 batches)")
    ap.add_argument("--pipelines", nargs="+", choices=["categorify", "hash"], default=["categorify", "hash"])
    args = ap.parse_args()
    shards = list_shards(args.data)
    groups = row_groups(shards)
    rows = sum(g.num_rows for g in groups)
    for name in args.pipelines:
        if name == "categorify":
            pipeline = Pipeline.from_file(REPO / "pipelines/criteo.yaml")
            pipeline.fit(shards, workers=2)
        else:
            pipeline = Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml")
        runs = [profile_transform(pipeline, groups, args.batch_size) for _ in range(args.repeat)]
        if name == "categorify":
            runs = [{**r, **profile_fit(Pipeline.from_file(REPO / "pipelines/criteo.yaml"), groups)} for r in runs]
        best = {k: (min(r[k][0] for r in runs), min(r[k][1] for r in runs)) for k in runs[0]}
        report(name, rows, best, args.repeat)
        print(f"{'threads overlap':52s} {'1 thread':>8s} {'2 threads':>9s} {'speed-up':>9s}")
        for label, (one, two) in overlap(pipeline, groups, args.repeat).items():
            print(f"{label:52s} {one:8.3f} {two:9.3f} {one / two:8.2f}x")


if __name__ == "__main__":
    main()
