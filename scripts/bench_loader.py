#!/usr/bin/env python3
"""Loader throughput and data wait, in one run, on a synthetic Criteo-like set.

For raw shards (categorify with fitted artifacts; hash) and for `etl preprocess` outputs of both pipelines:

1. rows/s of one shuffled epoch with a consumer that does nothing (the loader's own speed), and the CPU seconds
   the process spent on it (``time.process_time``, every thread: polars' readers, the workers, the assembler), a
   figure that moves less than wall time on a machine shared with other jobs;
2. the data-wait share of a consumer that spends 1.25x the loader's own time per batch (it consumes at 80 % of
   the loader's rate), over two consecutive epochs: the first one starts cold (its first shuffle buffer is
   filled while the consumer waits), the second one was started by the loader while the first drained, as in
   any epoch after the first of a training run. The step is modelled with ``time.sleep``: a GPU training step
   leaves the CPU cores to the loader. Also reported: the first epoch without its first batch (steady state).

    python scripts/bench_loader.py --data /tmp/g2m --batch-size 65536 --workers 2

``--sources raw`` measures the raw shards only (no preprocess runs), ``--repeat N`` takes the best of N epochs
for rows/s and CPU seconds. ``--cpu-by-stage`` also splits the CPU seconds of those epochs by stage (``StageCpu``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from etl.io.parquet import list_shards
from etl.loader import Loader
from etl.loader.assembler import Assembler
from etl.loader.pieces import HostReader, ProcessedReader
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import load_schema
from etl.tools.synth import generate

REPO = Path(__file__).resolve().parents[1]


class StageCpu:
    """CPU seconds of the loader's threads per stage, counted by wrapping the methods that do each stage's work
    (a measurement aid: it patches the loader's classes for the rest of the process): a worker turning a read
    piece into a chunk (``convert`` of the readers: transform and layout), the assembler filling shuffle buffers
    (``Assembler._buffer``, which also closes full ones) and gathering each batch into a ring slot
    (``Assembler._emit``). The Parquet read runs in polars' own threads: it is what the process spent beyond
    these and the consumer's thread."""

    STAGES = {"worker: transform + layout": [(HostReader, "convert"), (ProcessedReader, "convert")],
              "assembler: shuffle buffers": [(Assembler, "_buffer")],
              "assembler: gather into ring slots": [(Assembler, "_emit")]}  # fmt: skip

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.STAGES, 0.0)
        self.lock = threading.Lock()
        for stage, methods in self.STAGES.items():
            for cls, name in methods:
                setattr(cls, name, self._counted(stage, getattr(cls, name)))

    def _counted(self, stage: str, method: Callable) -> Callable:
        def counted(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                with self.lock:
                    self.seconds[stage] += time.thread_time() - t0

        return counted

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return dict(self.seconds)


def epoch(loader: Loader, step_seconds: float) -> tuple[float, float, float, int, float]:
    """(seconds, data-wait share, data-wait share after the first batch, rows, CPU seconds of the process) of
    the next epoch."""
    loader.set_epoch(loader.epoch + 1)
    loader.stats = type(loader.stats)()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    first_wait = None
    rows = 0
    for batch in loader:
        if first_wait is None:
            first_wait = loader.stats.wait_seconds
        rows += len(batch)
        if step_seconds:
            time.sleep(step_seconds)
    seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - cpu0
    s = loader.stats
    steady = (s.wait_seconds - first_wait) / max(seconds - first_wait, 1e-9)
    return seconds, s.wait_seconds / seconds, steady, rows, cpu_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--data", type=Path, default=None, help="raw synthetic set (generated when absent)")
    ap.add_argument("--batch-size", type=int, default=65536)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--sources", choices=["all", "raw"], default="all", help="raw: raw shards only (no preprocess)")
    ap.add_argument("--repeat", type=int, default=1, help="epochs measured for rows/s and CPU seconds (best of)")
    ap.add_argument("--cpu-by-stage", action="store_true", help="split the CPU seconds of the measured epochs by stage")
    args = ap.parse_args()
    stage_cpu = StageCpu() if args.cpu_by_stage else None

    work = Path(tempfile.mkdtemp(prefix="etl-loader-bench-"))
    data = args.data or work / "raw"
    if not data.exists():
        generate(load_schema(REPO / "schemas/criteo.yaml"), args.rows, args.files, data, seed=0)
    shards = list_shards(data)
    cat = Pipeline.from_file(REPO / "pipelines/criteo.yaml")
    cat.fit(shards, workers=args.workers)
    cat.save(work / "art")
    sources = {
        "raw, categorify": dict(source=data, pipeline=REPO / "pipelines/criteo.yaml", artifacts=work / "art"),
        "raw, hash": dict(source=data, pipeline=REPO / "pipelines/criteo_hash.yaml"),
    }
    if args.sources == "all":
        preprocess(Pipeline.load(work / "art"), shards, work / "pre_cat", workers=args.workers)
        preprocess(Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml"), shards, work / "pre_hash", workers=args.workers)
        sources |= {"preprocessed, categorify": dict(source=work / "pre_cat"), "preprocessed, hash": dict(source=work / "pre_hash")}
    results, results_split = {}, {}
    print(f"batch {args.batch_size:,}, workers {args.workers}, shuffle on")
    print(f"{'source':26s} {'rows/s':>12s} {'CPU s':>7s} {'wait @80%':>10s} {'w/o first':>10s} {'next epoch':>11s}")
    for name, kw in sources.items():
        loader = Loader(batch_size=args.batch_size, shuffle=True, seed=0, num_workers=args.workers, **kw)
        epoch(loader, 0.0)  # warm-up: JIT caches, page cache
        before = stage_cpu.snapshot() if stage_cpu else {}
        thread0 = time.thread_time()
        runs = [epoch(loader, 0.0) for _ in range(args.repeat)]
        if stage_cpu:
            after = stage_cpu.snapshot()
            split = {k: (after[k] - before[k]) / args.repeat for k in after}
            split["consumer thread"] = (time.thread_time() - thread0) / args.repeat
            split["Parquet read (polars threads) and the rest"] = sum(r[4] for r in runs) / args.repeat - sum(split.values())
            results_split[name] = split
        seconds, rows, cpu_seconds = min(r[0] for r in runs), runs[0][3], min(r[4] for r in runs)
        per_batch = seconds / len(loader)
        _, cold, steady, _, _ = epoch(loader, 1.25 * per_batch)
        _, warm, _, _, _ = epoch(loader, 1.25 * per_batch)
        results[name] = {"rows_per_second": rows / seconds, "cpu_seconds": cpu_seconds, "data_wait_first_epoch": cold,
                         "data_wait_first_epoch_after_first_batch": steady, "data_wait_next_epoch": warm}  # fmt: skip
        print(f"{name:26s} {rows / seconds:12,.0f} {cpu_seconds:7.3f} {100 * cold:9.2f}% {100 * steady:9.2f}% {100 * warm:10.2f}%")
        loader.close()
    for name, split in results_split.items():
        total = sum(split.values())
        print(f"\n{name}: CPU seconds per epoch by stage (mean of {args.repeat}), {total:.3f} in all")
        for stage, secs in split.items():
            print(f"  {stage:44s} {secs:7.3f} {100 * secs / total:6.1f}%")
        results[name]["cpu_seconds_by_stage"] = split
    if args.json:
        args.json.write_text(json.dumps({"batch_size": args.batch_size, "workers": args.workers, "results": results}, indent=1))


if __name__ == "__main__":
    main()
