#!/usr/bin/env python3
"""A producer of raw shards for continuous training: writes synthetic Criteo-like shards into a directory at a set
rate, as a log shipper would, for ``scripts/train_dlrm.py --follow`` or ``etl bench --follow`` to follow.

Each shard is written under a temporary name and renamed once complete, named ``part-NNNNNN.parquet`` so that name
order is arrival order (``etl.io.arrivals``). Shard ``k`` holds ``--shard-rows`` rows of ``etl.tools.synth`` data with
the row ids ``k * shard_rows .. k * shard_rows + shard_rows - 1`` in the schema's first integer dense column and
``k`` in its second (``etl.bench.freshness.traced_shard``), so a consumer can trace every row. A producer started
on a directory that already holds shards continues after the last one.

With ``--manifest``, the producer also lists each shard, once renamed, in the producer manifest ``_arrivals.json``
(``etl.io.arrivals_manifest``), for a consumer that follows with ``arrivals="manifest"``
(``etl preprocess --follow --arrivals manifest``, ``scripts/train_dlrm.py --arrivals manifest``). Started again, it
first lists the shards an interrupted run renamed but did not list yet.

    python scripts/produce_shards.py --out /tmp/stream --shard-rows 100000 --rate 0.5 --shards 0
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

from etl.bench.freshness import template_shard, traced_shard, write_shard
from etl.io.arrivals_manifest import read_arrivals, write_arrivals
from etl.schema import load_schema

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the directory to fill (created if missing)")
    ap.add_argument("--schema", type=Path, default=ROOT / "schemas/criteo.yaml")
    ap.add_argument("--shard-rows", type=int, default=100_000)
    ap.add_argument("--shards", type=int, default=0, help="shards to write, then stop (0: never stop)")
    ap.add_argument("--rate", type=float, default=1.0, help="shards per second")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic rows")
    ap.add_argument("--manifest", action="store_true", help="also list each shard in the producer manifest _arrivals.json")
    args = ap.parse_args()
    if args.rate <= 0 or args.shard_rows < 1 or args.shards < 0:
        ap.error("--rate must be > 0, --shard-rows >= 1, --shards >= 0")

    schema = load_schema(args.schema)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="produce-shards-") as work:
        template = template_shard(schema, args.shard_rows, Path(work), args.seed)
    existing = sorted(int(m.group(1)) for p in args.out.glob("part-*.parquet") if (m := re.fullmatch(r"part-(\d{6})\.parquet", p.name)))
    first = max(existing, default=-1) + 1
    listed: list[str] = []
    if args.manifest:  # the shards an interrupted run renamed but did not list come first
        listed = read_arrivals(args.out) or []
        listed += [name for name in (f"part-{k:06d}.parquet" for k in existing) if name not in listed]
        write_arrivals(args.out, listed)
    due = time.monotonic()
    k = first
    while not args.shards or k < first + args.shards:
        time.sleep(max(0.0, due - time.monotonic()))
        path = write_shard(args.out, k, traced_shard(template, schema, k))
        if args.manifest:
            listed.append(path.name)
            write_arrivals(args.out, listed)
        print(f"wrote {path} (rows {k * args.shard_rows:,} .. {(k + 1) * args.shard_rows - 1:,})", flush=True)
        k += 1
        due += 1.0 / args.rate


if __name__ == "__main__":
    main()
