#!/usr/bin/env python3
"""Time and peak memory of one fit, in threads or on a Dask cluster: one configuration per run, so that each
measurement starts from fresh processes.

Prints one JSON line: the configuration, seconds of ``Pipeline.fit``, rows, the largest vocabulary, the peak
resident memory (VmHWM) of this process (the client: it also holds the fitted vocabularies) and, on a cluster,
of every worker process, read from ``/proc/self/status`` by ``client.run`` after the fit.

    python scripts/bench_fit_cluster.py --pipeline P --input DIR --artifacts OUT [--cluster local:4] [--partitions 8]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from etl.io.parquet import list_shards
from etl.pipeline import Pipeline
from etl.runtime.cluster import connect


def peak_rss() -> int:
    """Peak resident memory of the calling process, in bytes (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", type=Path, required=True)
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--artifacts", type=Path, required=True)
    ap.add_argument("--cluster", default=None, help="local:N or a scheduler address (default: threads)")
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2, help="threads, without --cluster")
    args = ap.parse_args()

    shards = list_shards(args.input)
    p = Pipeline.from_file(args.pipeline)
    rows = [0]
    with connect(args.cluster) as client:
        args.artifacts.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        p.fit(shards, workers=args.workers, client=client, partitions=args.partitions, workdir=args.artifacts,
              progress=lambda _, n: rows.__setitem__(0, rows[0] + n))  # fmt: skip
        seconds = time.perf_counter() - t0
        workers = {} if client is None else client.run(peak_rss)
    p.save(args.artifacts)
    gib = 2**30
    print(json.dumps({
        "cluster": args.cluster or f"threads:{args.workers}", "partitions": args.partitions, "seconds": round(seconds, 2),
        "rows": rows[0], "largest_vocabulary": max(p.cardinalities().values()),
        "client_peak_rss_gib": round(peak_rss() / gib, 3),
        "worker_peak_rss_gib": sorted(round(v / gib, 3) for v in workers.values()),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
