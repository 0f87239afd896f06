"""`etl bench --follow`: how fresh the batches of a following loader are (``Loader(follow=True)``).

A producer thread (``Producer``) writes shards into an empty directory at a set rate (``rate`` shards per second),
each under a temporary name then renamed, as ``etl.io.arrivals`` requires (with ``arrivals="manifest"``, each also
listed in the producer manifest once renamed, ``etl.io.arrivals_manifest``); a consumer reads the directory with a
following loader in that arrival order and sleeps a simulated training step after each batch. Measured, in the same
run:

- ``shard transform``: the seconds to read and transform one shard in one thread (``Pipeline.transform``), the best
  of three;
- ``lag`` of each shard: from the moment the producer renames it (with the manifest: lists it) to the moment the
  consumer gets the first batch holding one of its rows (p50, p99, max over the shards);
- rows/s of the consumer loop and its stall (the share of the loop spent waiting for a batch; a consumer faster
  than the producer waits for shards that do not exist yet, so the stall is high by design when the producer
  is the bottleneck).

The must-hold of follow mode: lag p99 < 2 × ``poll_interval`` + one shard's transform time (a shard waits at
most one poll to be seen, its rows at most ``idle_flush`` = ``poll_interval`` in a shuffle buffer that is not
full, and one transform). ``Freshness.holds`` records whether this run met it.

Shards are traceable: shard ``k`` is a template of ``shard_rows`` synthetic rows (``etl.tools.synth``) whose first dense
column (``trace_columns``) holds the row id ``k * shard_rows + i`` and whose second holds ``k``. The consumer knows
the shard of a row by the value the pipeline makes of ``k`` (``shard_codes``).
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from etl.bench.report import Freshness, PipelineReport, Report, Stage
from etl.errors import ConfigError, LoaderError
from etl.io.arrivals import check_order
from etl.io.arrivals_manifest import write_arrivals
from etl.io.files import temporary_path
from etl.io.parquet import batch_from_arrow
from etl.loader import Loader
from etl.pipeline import Pipeline
from etl.schema import Schema
from etl.tools.synth import generate


@dataclass(frozen=True)
class FreshnessSettings:
    """A freshness run: ``rate`` shards per second of ``shard_rows`` rows each for ``duration`` seconds, a loader
    polling every ``poll_interval`` seconds (``idle_flush`` the same) with ``workers`` threads and ``batch_size``,
    a simulated step of ``step_factor`` × the transform time of one batch's rows; ``arrivals``: the arrival order
    (``etl.io.arrivals.ORDERS``; ``"manifest"``: the producer lists its shards in a producer manifest)."""

    rate: float = 1.0
    shard_rows: int = 131_072
    duration: float = 20.0
    poll_interval: float = 0.5
    batch_size: int = 65536
    workers: int = 2
    step_factor: float = 1.25
    seed: int = 0
    arrivals: str = "names"

    @property
    def shards(self) -> int:
        """How many shards the producer writes: one at start, then one every ``1 / rate`` seconds of ``duration``."""
        return 1 + math.floor(self.rate * self.duration)

    def check(self) -> None:
        """``ConfigError`` for a setting out of range."""
        if not (self.rate > 0 and self.duration >= 0 and self.poll_interval > 0 and self.shard_rows >= 1 and self.step_factor >= 0):
            raise ConfigError(f"freshness bench: rate and poll_interval must be > 0, duration and step_factor >= 0, shard_rows >= 1; got {self}")
        check_order(self.arrivals)


def trace_columns(schema: Schema) -> tuple[str, str]:
    """The dense columns that carry a traced shard's row id and shard number: the schema's first two (integer) dense
    columns; ``ConfigError`` when it has fewer."""
    dense = [c.name for c in schema.columns if c.role == "dense" and c.dtype.startswith("int")]
    if len(dense) < 2:
        raise ConfigError(f"schema {schema.name}: tracing shards needs two integer dense columns (row id, shard number), it has {dense}")
    return dense[0], dense[1]


def template_shard(schema: Schema, rows: int, work: Path, seed: int = 0) -> pa.Table:
    """``rows`` synthetic rows of ``schema`` (``etl.tools.synth.generate`` into ``work``), as a table in the raw layout."""
    (path,) = generate(schema, rows, 1, work / "template", seed=seed)
    return pq.read_table(str(path))


def traced_shard(template: pa.Table, schema: Schema, index: int) -> pa.Table:
    """Shard ``index``: ``template`` with the row ids ``index * n .. index * n + n - 1`` and the shard number
    ``index`` in the ``trace_columns`` (``n``: the template's rows)."""
    row_col, shard_col = trace_columns(schema)
    n = template.num_rows
    ids = pa.array(np.arange(index * n, (index + 1) * n, dtype=np.int64))
    table = template.set_column(template.schema.get_field_index(row_col), template.schema.field(row_col), ids)
    return table.set_column(table.schema.get_field_index(shard_col), table.schema.field(shard_col), pa.array(np.full(n, index, np.int64)))


def write_shard(directory: Path, index: int, table: pa.Table, before_rename: Callable[[], None] = lambda: None) -> Path:
    """Write ``table`` as ``directory/part-<index>.parquet`` (six digits, so that name order is arrival order):
    under a temporary name, then renamed (``before_rename`` is called just before). Returns the final path."""
    final = directory / f"part-{index:06d}.parquet"
    tmp = temporary_path(final)
    pq.write_table(table, tmp)
    before_rename()
    os.replace(tmp, final)
    return final


def shard_codes(pipeline: Pipeline, template: pa.Table, shards: int) -> dict[float, int]:
    """The value the pipeline makes of each shard number ``0 .. shards - 1`` in the shard column of
    ``trace_columns``, to shard number. ``ConfigError`` when two shard numbers give the same value."""
    _, shard_col = trace_columns(pipeline.schema)
    rows = template.slice(0, 1).take(pa.array(np.zeros(shards, np.int64)))
    rows = rows.set_column(rows.schema.get_field_index(shard_col), rows.schema.field(shard_col), pa.array(np.arange(shards, dtype=np.int64)))
    values = pipeline.transform_table(rows).column(shard_col).to_numpy()
    codes = {float(v): k for k, v in enumerate(values)}
    if len(codes) != shards:
        raise ConfigError(f"pipeline {pipeline.name}: its ops do not keep the shard numbers of column {shard_col} apart")
    return codes


def shard_transform_seconds(pipeline: Pipeline, path: Path, repeats: int = 3) -> float:
    """Seconds to read the shard at ``path`` and transform it in one thread: the best of ``repeats``."""
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        pipeline.transform(batch_from_arrow(pq.read_table(str(path)), pipeline.schema, str(path)))
        best = min(best, time.perf_counter() - t0)
    return best


class Producer(threading.Thread):
    """Writes ``shards`` traced shards (``traced_shard`` of ``template``) into ``directory``: shard 0 at once, then
    one every ``1 / rate`` seconds, on schedule (a late write is not made up by a burst: the next one is due
    ``1 / rate`` after the schedule); with ``manifest``, lists each one, once renamed, in the producer manifest.
    ``renamed[k]``: ``time.monotonic()`` just before shard ``k``'s rename (with ``manifest``: its listing).
    ``stop()`` ends it early; whoever starts it stops and joins it. An error while writing is kept in ``error``,
    then ``on_error`` is called (the bench closes its loader there, so that a consumer waiting for the shards that
    will not come stops waiting)."""

    def __init__(self, directory: Path, template: pa.Table, schema: Schema, shards: int, rate: float,
                 on_error: Callable[[], None] = lambda: None, manifest: bool = False):  # fmt: skip
        super().__init__(name="etl-bench-producer", daemon=True)
        self.directory, self.template, self.schema, self.shards, self.rate = directory, template, schema, shards, rate
        self.manifest = manifest
        self.on_error = on_error
        self.renamed: list[float] = []
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            due = time.monotonic()
            listed: list[str] = []
            for k in range(self.shards):
                if self._stop_event.wait(max(0.0, due - time.monotonic())):
                    return
                table = traced_shard(self.template, self.schema, k)
                if self.manifest:
                    listed.append(write_shard(self.directory, k, table).name)
                    self.renamed.append(time.monotonic())
                    write_arrivals(self.directory, listed)
                else:
                    write_shard(self.directory, k, table, lambda: self.renamed.append(time.monotonic()))
                due += 1.0 / self.rate
        except BaseException as e:  # reported by the consumer, which owns this thread
            self.error = e
            self.on_error()

    def stop(self) -> None:
        self._stop_event.set()


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


def measure_freshness(pipeline_path: Path, settings: FreshnessSettings, work: Path,
                      progress: Callable[[str], None] = lambda msg: None) -> tuple[PipelineReport, float]:  # fmt: skip
    """One freshness run of the fit-free pipeline at ``pipeline_path`` (module docstring), its files in ``work``:
    the pipeline's report (stages ``shard transform`` and ``follow``, ``data_wait`` the stall, ``freshness`` the lags)
    and the megabytes of Parquet the producer wrote. ``RuntimeError`` if the producer failed (its ``on_error`` closes
    the loader, which ends the consumer's wait with ``LoaderError``)."""
    settings.check()
    pipeline = Pipeline.from_file(pipeline_path)
    progress(f"{pipeline.name}: template shard of {settings.shard_rows:,} rows")
    template = template_shard(pipeline.schema, settings.shard_rows, work, settings.seed)
    codes = shard_codes(pipeline, template, settings.shards)
    sample = write_shard(work, 0, traced_shard(template, pipeline.schema, 0))
    transform_s = shard_transform_seconds(pipeline, sample)
    step_s = settings.step_factor * transform_s * settings.batch_size / settings.shard_rows
    stream = work / "stream"
    stream.mkdir()
    loader = Loader(stream, pipeline=pipeline_path, batch_size=settings.batch_size, shuffle=True, seed=settings.seed, follow=True,
                    poll_interval=settings.poll_interval, idle_flush=settings.poll_interval, num_workers=settings.workers,
                    arrivals=settings.arrivals)  # fmt: skip
    producer = Producer(stream, template, pipeline.schema, settings.shards, settings.rate, on_error=loader.close,
                        manifest=settings.arrivals == "manifest")  # fmt: skip
    shard_col = loader.layout.dense.index(trace_columns(pipeline.schema)[1])
    total, rows = settings.shards * settings.shard_rows, 0
    first_seen: dict[int, float] = {}  # shard number -> when its first row came in a batch
    progress(f"{pipeline.name}: following {settings.shards} shards at {settings.rate:g}/s")
    producer.start()
    t0 = time.perf_counter()
    try:
        for batch in loader:
            now = time.monotonic()
            for value in np.unique(batch.dense[:, shard_col].numpy()):
                first_seen.setdefault(codes[float(value)], now)
            rows += len(batch)
            if rows >= total:
                break
            time.sleep(step_s)
        seconds = time.perf_counter() - t0
    except LoaderError:
        if producer.error is None:
            raise
    finally:
        loader.close()
        producer.stop()
        producer.join()
    if producer.error is not None:
        raise RuntimeError(f"the producer of the freshness bench failed: {producer.error}") from producer.error
    lags = [first_seen[k] - producer.renamed[k] for k in range(settings.shards)]
    fresh = Freshness(rate=settings.rate, shard_rows=settings.shard_rows, shards=settings.shards, poll_interval=settings.poll_interval,
                      step_seconds=step_s, shard_transform_seconds=transform_s, lag_p50=_percentile(lags, 50),
                      lag_p99=_percentile(lags, 99), lag_max=max(lags), lags=lags, arrivals=settings.arrivals)  # fmt: skip
    note = (f"lag p50 {1000 * fresh.lag_p50:.0f} ms, p99 {1000 * fresh.lag_p99:.0f} ms, max {1000 * fresh.lag_max:.0f} ms; "
            f"bound {1000 * fresh.bound:.0f} ms: {'holds' if fresh.holds else 'MISSED'}")  # fmt: skip
    report = PipelineReport(pipeline=str(pipeline_path), data_wait=loader.stats.data_wait_fraction, freshness=fresh)
    report.stages = [Stage("shard transform", transform_s, settings.shard_rows, note="read + transform, one thread"),
                     Stage("follow", seconds, rows, note=note)]  # fmt: skip
    mbytes = sum(p.stat().st_size for p in stream.glob("*.parquet")) / 1e6
    return report, mbytes


def run_freshness_bench(pipelines: list[Path], settings: FreshnessSettings, progress: Callable[[str], None] = lambda msg: None) -> Report:
    """``measure_freshness`` of each pipeline (batches on the CPU), in a temporary directory removed at the end, as
    one ``Report``."""
    report = Report(rows=0, files=0, input_mbytes=0.0, workers=settings.workers, batch_size=settings.batch_size, device="cpu")
    for path in pipelines:
        work = Path(tempfile.mkdtemp(prefix="etl-bench-follow-"))
        try:
            rep, mbytes = measure_freshness(path, settings, work, progress)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        report.pipelines.append(rep)
        report.rows += settings.shards * settings.shard_rows
        report.files += settings.shards
        report.input_mbytes += mbytes
    report.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return report
