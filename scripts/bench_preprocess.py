#!/usr/bin/env python3
"""Offline preprocessing throughput: `etl fit` / `etl preprocess` against naive polars and numpy scripts, in one run.

Generates (or reuses) a synthetic Criteo-like set, then times, on the same files and machine:

- ours: fit of the categorify pipeline; preprocess with the categorify pipeline (artifacts given); preprocess with
  the hash pipeline;
- baselines (``etl.bench.baselines``), the same work written the way a user would:
  - a plain polars script (value counts per column for the vocabularies, `replace_strict` to map keys to ids,
    polars' own hash modulo N for the hash pipeline), reading with polars and writing Parquet;
  - a plain pyarrow + numpy script (`read_table`, hex decode over the Arrow buffers, `np.unique` counts for the
    vocabularies, `np.searchsorted` lookup, etl's documented fmix64 hash in numpy uint64 arithmetic).

Outputs are compared value for value with ours: the polars and numpy categorify outputs and the numpy hash output
must be identical (the script exits non-zero otherwise), so the ratios compare the same work. The polars hash
baseline uses polars' hash, so its ids differ by construction; its work is the same.

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

from etl.bench.baselines import first_difference, numpy_categorify, numpy_hash
from etl.bench.polars_baselines import polars_categorify, polars_hash
from etl.io.parquet import list_shards
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.runtime.allocator import tune_allocator
from etl.schema import load_schema
from etl.tools.synth import generate

REPO = Path(__file__).resolve().parents[1]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_of(repeat: int, fn) -> float:
    """Median seconds of ``repeat`` runs of ``fn`` (which returns the seconds of one run)."""
    return float(np.median([fn() for _ in range(repeat)]))


def main() -> None:
    tune_allocator()
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
    res["naive polars fit + preprocess (categorify)"] = median_of(n, lambda: baseline(polars_categorify, "polars_cat"))
    res["naive polars preprocess (hash)"] = median_of(n, lambda: baseline(polars_hash, "polars_hash"))
    res["naive numpy fit + preprocess (categorify)"] = median_of(n, lambda: baseline(numpy_categorify, "numpy_cat"))
    res["naive numpy preprocess (hash)"] = median_of(n, lambda: baseline(numpy_hash, "numpy_hash"))

    checks = [("categorify", "ours_cat", "polars_cat"), ("categorify", "ours_cat", "numpy_cat"), ("hash", "ours_hash", "numpy_hash")]
    for what, a, b in checks:
        diff = first_difference(work / a, work / b)
        if diff is not None:
            raise SystemExit(f"{what} outputs differ between ours ({work / a}) and the {b.split('_')[0]} baseline ({work / b}): {diff}")

    print(f"{rows:,} rows, {len(files)} files, workers={args.workers}, median of {n} runs each")
    print(f"{'run':45s} {'seconds':>9s} {'rows/s':>12s}")
    for k, v in res.items():
        print(f"{k:45s} {v:9.2f} {rows / v:12,.0f}")
    ratio_cat = res["naive polars fit + preprocess (categorify)"] / res["ours fit + preprocess (categorify)"]
    ratio_hash = res["naive polars preprocess (hash)"] / res["ours preprocess (hash)"]
    np_cat = res["naive numpy fit + preprocess (categorify)"] / res["ours fit + preprocess (categorify)"]
    np_hash = res["naive numpy preprocess (hash)"] / res["ours preprocess (hash)"]
    print(f"speed-up over naive polars: categorify (fit + preprocess) {ratio_cat:.2f}x, hash {ratio_hash:.2f}x")
    print(f"speed-up over naive numpy:  categorify (fit + preprocess) {np_cat:.2f}x, hash {np_hash:.2f}x")
    print("outputs identical to ours: polars categorify yes, numpy categorify yes, numpy hash yes "
          "(polars hash: own hash function, ids differ by construction)")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "files": len(files), "workers": args.workers, "repeat": n, "seconds": res,
                                         "speedup_categorify": ratio_cat, "speedup_hash": ratio_hash,
                                         "speedup_numpy_categorify": np_cat, "speedup_numpy_hash": np_hash,
                                         "identical": {"polars_categorify": True, "numpy_categorify": True, "numpy_hash": True}}, indent=1))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
