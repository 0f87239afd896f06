#!/usr/bin/env python3
"""Where the time goes, per core: every step of fit and of the transform path, one thread, on the same shards.

For each row group in turn (read from the files each time, as the loader and fit do), times: the Parquet read
(polars; its decoder may use a second core inside one call), Arrow → numpy views, each op of the pipeline, the
output checks, the loader's chunk layout, and what preprocess adds (typed Arrow table, Parquet encode + write to
memory, sha256); for the categorify pipeline also fit's counting per column group (KeyCounter.add) and finalize.
Best of ``--repeat`` passes per step. The sum is the work of one row on one core; with two cores and perfect
overlap the end-to-end rate is at most twice the "per core" figure.

    python scripts/bench_profile.py --data /tmp/g2m --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from etl.allocator import tune_allocator
from etl.backends import cpu
from etl.io.parquet import batch_from_arrow, list_shards, read_rows
from etl.loader.chunk import Chunk, Layout
from etl.loader.order import row_groups
from etl.pipeline import Pipeline

REPO = Path(__file__).resolve().parents[1]


def profile_transform(pipeline: Pipeline, groups: list) -> dict[str, float]:
    spent: dict[str, float] = {}

    def tick(name: str, t0: float) -> float:
        t = time.perf_counter()
        spent[name] = spent.get(name, 0.0) + t - t0
        return t

    layout = Layout.of(pipeline)
    for g in groups:
        t0 = time.perf_counter()
        table = read_rows(g.path, pipeline.schema.names, g.first_row, g.num_rows, g.index)
        t0 = tick("read (polars)", t0)
        batch = batch_from_arrow(table, pipeline.schema)
        t0 = tick("columns (Arrow → numpy views)", t0)
        for op in pipeline.ops:
            batch = batch.with_columns(op.transform(batch, pipeline.xp))
            t0 = tick(f"op {op.name}", t0)
        pipeline.check_output(batch)
        t0 = tick("output checks", t0)
        Chunk.from_batch(batch, layout)
        t0 = tick("chunk (loader layout)", t0)
        out = pipeline.to_arrow(batch)
        t0 = tick("preprocess: typed Arrow table", t0)
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, out.schema, use_dictionary=False, compression="none", write_statistics=False) as w:
            w.write_table(out)
        t0 = tick("preprocess: Parquet encode", t0)
        hashlib.sha256(memoryview(sink.getvalue())).hexdigest()
        tick("preprocess: sha256", t0)
    return spent


def profile_fit(pipeline: Pipeline, groups: list) -> dict[str, float]:
    """fit's work for a Decode + Categorify pipeline, one thread: read the needed columns, decode, count."""
    decode = next(op for op in pipeline.ops if op.name == "Decode")
    cat = next(op for op in pipeline.ops if op.name == "Categorify")
    columns = ["label", *cat.columns]
    stats = cat.new_stats(cpu)
    spent: dict[str, float] = {}

    def tick(name: str, t0: float) -> float:
        t = time.perf_counter()
        spent[name] = spent.get(name, 0.0) + t - t0
        return t

    for g in groups:
        t0 = time.perf_counter()
        table = read_rows(g.path, columns, g.first_row, g.num_rows, g.index)
        t0 = tick("fit: read label + categoricals", t0)
        batch = batch_from_arrow(table, pipeline.schema, columns=columns)
        batch = batch.with_columns(decode.transform(batch, cpu))
        t0 = tick("fit: columns + decode", t0)
        for c in cat.columns:
            cat.partial_fit({c: stats[c]}, batch, cpu)
            size = stats[c]["counter"].size
            t0 = tick("fit: count, columns of < 64 k keys" if size < 65536 else "fit: count, columns of >= 64 k keys", t0)
    t0 = time.perf_counter()
    cat.finalize(stats, cpu)
    tick("fit: finalize (threshold, sort, vocabulary tables)", t0)
    return spent


def main() -> None:
    tune_allocator()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="raw Criteo-layout shards")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    shards = list_shards(args.data)
    groups = row_groups(shards)
    rows = sum(g.num_rows for g in groups)
    fitted = Pipeline.from_file(REPO / "pipelines/criteo.yaml")
    fitted.fit(shards, workers=2)
    for name, pipeline in (("categorify", fitted), ("hash", Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml"))):
        runs = [profile_transform(pipeline, groups) for _ in range(args.repeat)]
        if name == "categorify":
            runs = [{**r, **profile_fit(Pipeline.from_file(REPO / "pipelines/criteo.yaml"), groups)} for r in runs]
        best = {k: min(r[k] for r in runs) for k in runs[0]}
        print(f"\n{name} pipeline, {rows:,} rows, one thread (best of {args.repeat})")
        print(f"{'step':52s} {'seconds':>8s} {'M rows/s':>9s}")
        for k, v in best.items():
            print(f"{k:52s} {v:8.3f} {rows / v / 1e6:9.1f}")
        loader = sum(v for k, v in best.items() if not k.startswith(("preprocess", "fit")))
        pre = sum(v for k, v in best.items() if not k.startswith(("chunk", "fit")))
        print(f"{'per core: read → chunk (the loader worker path)':52s} {loader:8.3f} {rows / loader / 1e6:9.2f}")
        print(f"{'per core: read → Parquet + sha256 (preprocess)':52s} {pre:8.3f} {rows / pre / 1e6:9.2f}")
        if name == "categorify":
            fit = sum(v for k, v in best.items() if k.startswith("fit"))
            print(f"{'per core: fit':52s} {fit:8.3f} {rows / fit / 1e6:9.2f}")


if __name__ == "__main__":
    main()
