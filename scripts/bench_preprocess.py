#!/usr/bin/env python3
"""Offline preprocessing throughput: `etl fit` / `etl preprocess` against a naive polars script, in one run.

Generates (or reuses) a synthetic Criteo-like set, then times, on the same files and machine:

- ours: fit of the categorify pipeline; preprocess with the categorify pipeline (artifacts given); preprocess with
  the hash pipeline;
- baseline: a plain polars script doing the same work the way a user would write it (value counts per column for
  the vocabularies, `replace_strict` to map keys to ids, polars' own hash modulo N for the hash pipeline), reading
  with polars and writing Parquet.

The categorify outputs are compared value for value (dense and ids must be identical), so the ratio compares the
same work. The hash baseline uses polars' hash, so its ids differ by construction; its work is the same.

    python scripts/bench_preprocess.py --rows 2000000 --files 8 --workers 2 --repeat 5 --data /tmp/bench-data
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.readers import list_shards
from etl.schema import load_schema
from etl.synth import generate

REPO = Path(__file__).resolve().parents[1]
DENSE = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]
THRESHOLD = 3
BUCKETS = 40_000_000


def dense_exprs() -> list[pl.Expr]:
    return [pl.col(c).fill_null(0).clip(lower_bound=0).cast(pl.Float64).log1p().cast(pl.Float32) for c in DENSE]


def naive_polars_categorify(files: list[Path], out: Path) -> None:
    vocabs = {}
    for c in CATS:
        vc = (
            pl.scan_parquet(files).select(pl.col(c)).drop_nulls().group_by(c).len()
            .filter(pl.col("len") >= THRESHOLD)
            .with_columns(pl.col(c).str.to_integer(base=16).alias("key"))
            .sort(["len", "key"], descending=[True, False])
            .collect()
        )
        vocabs[c] = (vc[c], pl.Series(np.arange(3, 3 + vc.height, dtype=np.int32)))
    out.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(files):
        df = pl.read_parquet(f)
        cats = [
            pl.when(pl.col(c).is_null()).then(pl.lit(1, pl.Int32)).otherwise(
                pl.col(c).replace_strict(vocabs[c][0], vocabs[c][1], default=pl.lit(2, pl.Int32), return_dtype=pl.Int32)
            ).alias(c)
            for c in CATS
        ]
        df.select([pl.col("label").cast(pl.Float32), *dense_exprs(), *cats]).write_parquet(out / f"part-{i:05d}.parquet")


def naive_polars_hash(files: list[Path], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(files):
        df = pl.read_parquet(f)
        cats = [
            pl.when(pl.col(c).is_null()).then(pl.lit(1, pl.Int32)).otherwise(
                (pl.col(c).str.to_integer(base=16).hash(0) % BUCKETS + 2).cast(pl.Int32)
            ).alias(c)
            for c in CATS
        ]
        df.select([pl.col("label").cast(pl.Float32), *dense_exprs(), *cats]).write_parquet(out / f"part-{i:05d}.parquet")


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_of(repeat: int, fn) -> float:
    """Median seconds of ``repeat`` runs of ``fn`` (which returns the seconds of one run)."""
    return float(np.median([fn() for _ in range(repeat)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data", type=Path, default=None, help="where the synthetic set lives (reused when present)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is reported")
    ap.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="etl-bench-"))
    data = args.data or work / "raw"
    schema = load_schema(REPO / "schemas/criteo.yaml")
    if not data.exists():
        generate(schema, args.rows, args.files, data, seed=0)
    files = list_shards(data)
    rows = sum(pl.scan_parquet(f).select(pl.len()).collect().item() for f in files)

    res: dict[str, float] = {}
    n = args.repeat

    def fit_categorify() -> float:
        p = Pipeline.from_file(REPO / "pipelines/criteo.yaml")
        seconds = timed(lambda: p.fit(files, workers=args.workers))
        p.save(work / "art")
        return seconds

    def ours(pipeline: str, out: str, artifacts: Path | None) -> float:
        shutil.rmtree(work / out, ignore_errors=True)
        p = Pipeline.from_file(REPO / pipeline)
        return preprocess(p, files, work / out, artifacts=artifacts, workers=args.workers).transform_seconds

    def baseline(fn, out: str) -> float:
        shutil.rmtree(work / out, ignore_errors=True)
        return timed(lambda: fn(files, work / out))

    res["ours fit (categorify)"] = median_of(n, fit_categorify)
    res["ours preprocess (categorify)"] = median_of(n, lambda: ours("pipelines/criteo.yaml", "ours_cat", work / "art"))
    res["ours fit + preprocess (categorify)"] = res["ours fit (categorify)"] + res["ours preprocess (categorify)"]
    res["ours preprocess (hash)"] = median_of(n, lambda: ours("pipelines/criteo_hash.yaml", "ours_hash", None))
    res["naive polars fit + preprocess (categorify)"] = median_of(n, lambda: baseline(naive_polars_categorify, "polars_cat"))
    res["naive polars preprocess (hash)"] = median_of(n, lambda: baseline(naive_polars_hash, "polars_hash"))

    ours = pl.read_parquet(sorted((work / "ours_cat").glob("part-*.parquet")))
    theirs = pl.read_parquet(sorted((work / "polars_cat").glob("part-*.parquet")))
    if not ours.equals(theirs):
        raise SystemExit("categorify outputs differ between ours and the polars baseline")

    print(f"{rows:,} rows, {len(files)} files, workers={args.workers}, median of {n} runs each")
    print(f"{'run':45s} {'seconds':>9s} {'rows/s':>12s}")
    for k, v in res.items():
        print(f"{k:45s} {v:9.2f} {rows / v:12,.0f}")
    ratio_cat = res["naive polars fit + preprocess (categorify)"] / res["ours fit + preprocess (categorify)"]
    ratio_hash = res["naive polars preprocess (hash)"] / res["ours preprocess (hash)"]
    print(f"speed-up over naive polars: categorify (fit + preprocess) {ratio_cat:.2f}x, hash {ratio_hash:.2f}x")
    print("categorify outputs identical to the baseline's: yes")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "files": len(files), "workers": args.workers, "repeat": n, "seconds": res,
                                         "speedup_categorify": ratio_cat, "speedup_hash": ratio_hash}, indent=1))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
