#!/usr/bin/env python3
"""Loader throughput from object storage, with and without request latency.

Starts a local S3 API (moto in server mode, in a process of its own), generates a synthetic Criteo-like set,
preprocesses it (hash pipeline) and uploads the raw shards and the processed output. Then ``--epochs`` consecutive
epochs of the Loader (shuffled, a consumer that does nothing) are timed on each source from local disk, from S3,
and from S3 with an artificial latency added to every S3 request (an ``asyncio.sleep`` before each call s3fs makes,
in this process only), for each number of worker threads asked for; with latency, also with the loader's pool
limited to ``num_workers`` threads (as for local files) to show what reading every piece in flight at once buys.
The S3 requests of each case without latency are counted by operation (all its runs, the loaders' construction
included).

    python scripts/bench_object_storage.py --rows 1000000 --latency-ms 30 --workers 2 --repeat 2 --epochs 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from etl.io.fs import Url, location
from etl.io.parquet import list_shards
from etl.loader import Loader
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.resources import resource_path
from etl.tools.synth import generate

#: S3 requests made by this process, by operation (counted by ``instrument``)
REQUESTS: Counter[str] = Counter()
#: the latency added to every S3 request, in seconds
LATENCY = [0.0]


def instrument() -> None:
    """Count every request s3fs makes (``REQUESTS``) and delay it by ``LATENCY[0]`` seconds."""
    import s3fs

    call = s3fs.S3FileSystem._call_s3

    async def delayed(self: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        REQUESTS[method if isinstance(method, str) else getattr(method, "__name__", str(method))] += 1
        if LATENCY[0]:
            await asyncio.sleep(LATENCY[0])
        return await call(self, method, *args, **kwargs)

    s3fs.S3FileSystem._call_s3 = delayed


def epoch(source: Any, workers: int, batch_size: int, repeat: int, epochs: int, overlap: bool = True, **args: Any) -> float:
    """rows/s of ``epochs`` consecutive shuffled epochs over ``source`` (a training run's steady state: each epoch is
    read ahead while the one before drains) with a consumer that does nothing, the best of ``repeat`` runs;
    ``overlap=False`` gives the loader's pool ``num_workers`` threads even for object storage."""
    best = 0.0
    for _ in range(repeat):
        loader = Loader(source, batch_size=batch_size, shuffle=True, seed=0, num_workers=workers, **args)
        loader.remote = loader.remote and overlap
        try:
            t0 = time.perf_counter()
            rows = 0
            for e in range(epochs):
                loader.set_epoch(e)
                rows += sum(len(b) for b in loader)
            best = max(best, rows / (time.perf_counter() - t0))
        finally:
            loader.close()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=65536)
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--latency-ms", type=float, default=30.0)
    ap.add_argument("--repeat", type=int, default=1, help="Measurements per case; the best is reported.")
    ap.add_argument("--epochs", type=int, default=1, help="Consecutive epochs per measurement.")
    a = ap.parse_args()

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    try:
        bucket = location("s3://etl-bench")
        assert isinstance(bucket, Url)
        for _ in range(100):  # wait for the server to listen
            try:
                bucket.fs.mkdir(bucket.key)
                break
            except OSError:
                time.sleep(0.1)
        with tempfile.TemporaryDirectory(prefix="etl-bench-s3-") as tmp:
            work = Path(tmp)
            pipeline_path = resource_path("pipelines", "criteo_hash.yaml")
            p = Pipeline.from_file(pipeline_path)
            generate(p.schema, a.rows, a.files, work / "raw", seed=0)
            preprocess(p, list_shards(work / "raw"), work / "out", workers=2)
            for d in ("raw", "out"):
                bucket.fs.put(str(work / d), f"{bucket.key}/{d}", recursive=True)
            sources = {
                "processed": (work / "out", "s3://etl-bench/out", {}),
                "raw, hash": (work / "raw", "s3://etl-bench/raw", {"pipeline": pipeline_path}),
            }
            parts = bucket.fs.glob(f"{bucket.key}/out/part-*.parquet")
            t0 = time.perf_counter()
            size = sum(len(bucket.fs.cat_file(k)) for k in parts)
            print(f"the S3 server's GET throughput (processed parts, one at a time): {size / 1e6 / (time.perf_counter() - t0):,.0f} MB/s")
            instrument()
            results: dict[tuple[str, str, int], float] = {}
            for w in a.workers:
                for name, (local, url, args) in sources.items():
                    results[(name, "local", w)] = epoch(local, w, a.batch_size, a.repeat, a.epochs, **args)
                    REQUESTS.clear()
                    results[(name, "s3", w)] = epoch(url, w, a.batch_size, a.repeat, a.epochs, **args)
                    print(f"{name}, {w} workers: S3 requests: {dict(REQUESTS)}")
            LATENCY[0] = a.latency_ms / 1000
            for w in a.workers:
                for name, (_, url, args) in sources.items():
                    results[(name, f"s3 +{a.latency_ms:g} ms", w)] = epoch(url, w, a.batch_size, a.repeat, a.epochs, **args)
                    results[(name, f"s3 +{a.latency_ms:g} ms, {w} threads", w)] = epoch(
                        url, w, a.batch_size, a.repeat, a.epochs, overlap=False, **args
                    )
    finally:
        server.terminate()
        server.wait()
    print(f"{a.rows:,} rows in {a.files} shard(s), batch {a.batch_size:,}; rows/s of {a.epochs} shuffled epoch(s) (best of {a.repeat})")
    for (name, where, w), rate in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        print(f"  {name:10s} workers {w:2d}  {where:24s} {rate:>12,.0f}")


if __name__ == "__main__":
    main()
