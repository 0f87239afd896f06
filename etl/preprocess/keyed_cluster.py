"""``etl preprocess --cluster`` of a pipeline with a keyed step (History, Groupby): the exchange by key through
Dask's own shuffle, with the partitions, bytes and manifest of the threaded run (``etl.preprocess.keyed``).

After the fit (on the cluster, ``etl.pipeline.distributed``) and the artifacts' save, on the workers:

1. Measure: one task per shard reads it, runs each row group through the row-scope stages and counts, per key-hash
   bucket, the rows read, each stage's rows in and out and the spilled rows' bytes
   (``etl.preprocess.keyed_partition.spill_row_group``). The driver sums them and cuts the buckets into the
   partitions of the threaded run (``etl.pipeline.exchange.plan``: the same counts, the same cut).
2. Shuffle: a Dask DataFrame (``dask.dataframe.from_map``) holds, per shard, its spilled rows (pandas with Arrow
   dtypes: the values as read, exactly) with their partition number in ``/part``; ``set_index('/part')`` with one
   division per partition moves each row to its partition's Dask partition. The shuffle is Dask's P2P shuffle
   (``distributed``'s, which buffers on the workers' disks), or its task shuffle when the schema has list columns
   (the P2P shuffle cannot take pandas' Arrow list dtypes).
3. Transform: one task per output partition takes its Dask partition, checks it (the rows of its buckets, as many
   as were counted, each with a position in the input shards), sorts it as ``read_partition`` does and writes it
   through the step (``keyed_partition.write_partition``); the driver commits each as the threaded run does.

Every task runs through ``etl.runtime.cluster_tasks.run_tasks``: the first error (a ``RowError`` naming the source
shard and row) stops the run, a task whose workers keep dying is a ``ClusterError`` naming its shard or partition.
A task run again (a worker died) reads or writes the same: the shards are read, the outputs written under
temporary names and committed by the driver. The shards are read three times (fit, measure, shuffle).

Memory: a transform task holds its partition (at most ``etl.preprocess.keyed.partition_bytes``, as in threads)
about three times (as shuffled, as Arrow, sorted); a worker runs as many at once as it has threads. The shuffle's
memory is Dask's (P2P: bounded buffers, the rest on disk).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.io.files import remove_temporaries
from etl.io.fs import Location
from etl.io.parquet import open_shard
from etl.io.processed import ARTIFACTS, QUARANTINE, ManifestEntry, StageRows, part_path
from etl.pipeline import Pipeline
from etl.pipeline.exchange import INPUT, ROW, plan, row_buckets, sort_partition, spill_schema
from etl.preprocess.keyed_partition import BucketCounts, KeyedJob, PartitionCommits, spill_row_group, write_partition
from etl.preprocess.keyed_step import KeyedStep
from etl.preprocess.shard import WrittenShard
from etl.preprocess.tasks import fitted
from etl.runtime.cluster_tasks import Stop, run_tasks
from etl.schema import Schema

if TYPE_CHECKING:
    import pandas as pd

    from etl.preprocess.run import RunSettings

#: The column of the shuffled rows holding their partition (the index Dask's shuffle moves them by).
PART = "/part"


def transform_on_cluster(run: RunSettings, pipeline: Pipeline, step: KeyedStep, target: int, previous: dict[str, ManifestEntry],
                         sha: str) -> list[ManifestEntry]:  # fmt: skip
    """Exchange and transform on the cluster of ``run.client`` (see the module docstring), partitions of at most
    ``target`` bytes, committed with the manifest (``previous``: the earlier run's entries; ``sha``: the saved
    artifacts' checksum); the entries, in output order."""
    import dask.dataframe as dd

    client, out_dir = run.client, run.out_dir
    if client is None:
        raise ValueError("transform_on_cluster needs a Dask client")
    key = uuid.uuid4().hex
    artifacts = out_dir / ARTIFACTS
    shards = list(enumerate(run.shards))
    counts = BucketCounts.zeros(len(pipeline.stages))

    def measured(_k: int, counted: BucketCounts | None) -> None:
        if counted is not None:  # None: stopped, and the run raises
            counts.add(counted)

    run_tasks(client, functools.partial(measure_task, artifacts, sha, key), shards, measured, _pass(run, "exchange"),
              describe=lambda item: str(item[1]))  # fmt: skip
    ranges = plan(counts.sizes, target)
    starts = np.array([lo for lo, _ in ranges], np.int64)
    meta = _frame(spill_schema(pipeline.schema).empty_table(), np.zeros(0, np.int64))
    frames = dd.from_map(functools.partial(spill_frame, artifacts, sha, key, starts), shards, meta=meta, label="etl-spill", enforce_metadata=False)
    method = "tasks" if any(c.is_list for c in pipeline.schema.columns) else "p2p"
    parts = frames.set_index(PART, divisions=list(range(len(ranges) + 1)), shuffle_method=method).to_delayed()
    if len(parts) != len(ranges):
        raise RuntimeError(f"the shuffle made {len(parts)} partitions, expected {len(ranges)}")
    outputs = [part_path(out_dir, p) for p in range(len(ranges))]
    items = [(p, len(ranges), outputs[p], lo, hi, counts.of(lo, hi, pipeline)) for p, (lo, hi) in enumerate(ranges)]
    commits = PartitionCommits(out_dir, pipeline.name, len(ranges), previous, sha, bool(run.training) if pipeline.training_differs else None)

    def commit(_k: int, written: WrittenShard | None) -> None:
        if written is not None:
            commits.commit(written)

    job = KeyedJob(run.shards, run.on_error, run.compression, bool(run.training), run.split_stage)
    try:
        run_tasks(client, functools.partial(partition_task, artifacts, sha, key, job), items, commit, _pass(run, "transform"), inputs=parts,
                  describe=lambda item: f"partition {item[0]} of {item[1]} of the exchange by key '{step.key}'")  # fmt: skip
    finally:  # what the attempts of tasks whose worker died, or that were stopped, left behind
        remove_temporaries(out_dir)
        remove_temporaries(out_dir / QUARANTINE)
    return [commits.entries[o.name] for o in outputs]


def _pass(run: RunSettings, name: str) -> Callable[[int], None] | None:
    progress = run.progress
    return None if progress is None else functools.partial(progress, name)


def measure_task(artifacts: Location, sha: str, run: str, item: tuple[int, Location], stop: Stop,
                 progress: Callable[[int], None]) -> BucketCounts | None:  # fmt: skip
    """The counts per bucket of shard ``item`` = (its index, its path) (None when stopped), with the pipeline run
    ``run`` saved in ``artifacts`` (``etl.preprocess.tasks.fitted``)."""
    pipeline = fitted(artifacts, sha, run)
    step = _step(pipeline)
    index, path = item
    shard = open_shard(path, pipeline.schema)
    counts = BucketCounts.zeros(len(pipeline.stages))
    for i in range(shard.num_row_groups):
        if stop.is_set():
            return None
        table = shard.read_table(i)
        counts.add(spill_row_group(pipeline, step, table, str(path), index, i, shard.row_group_starts[i])[1])
        progress(table.num_rows)
    return counts


def spill_frame(artifacts: Location, sha: str, run: str, starts: np.ndarray, item: tuple[int, Location]) -> pd.DataFrame:
    """The spilled rows of shard ``item`` = (its index, its path) as a pandas DataFrame with Arrow dtypes, with the
    partition of each row in ``PART`` (``starts``: the first bucket of each partition)."""
    pipeline = fitted(artifacts, sha, run)
    step = _step(pipeline)
    index, path = item
    shard = open_shard(path, pipeline.schema)
    pieces = [spill_row_group(pipeline, step, shard.read_table(i), str(path), index, i, shard.row_group_starts[i])[0]
              for i in range(shard.num_row_groups)]  # fmt: skip
    table = pa.concat_tables(pieces) if pieces else spill_schema(pipeline.schema).empty_table()
    return _frame(table, np.searchsorted(starts, row_buckets(table), side="right") - 1)


def partition_task(artifacts: Location, sha: str, run: str, job: KeyedJob, frame: pd.DataFrame,
                   item: tuple[int, int, Location, int, int, tuple[int, tuple[StageRows, ...]]], stop: Stop,
                   progress: Callable[[int], None]) -> WrittenShard | None:  # fmt: skip
    """Partition ``p`` of ``count`` (``item`` = (p, count, output path, first bucket, bucket past the last, its
    counts: ``BucketCounts.of``); ``frame``: its shuffled rows) written through the keyed step
    (``keyed_partition.write_partition``)."""
    pipeline = fitted(artifacts, sha, run)
    step = _step(pipeline)
    p, count, out, lo, hi, counted = item
    rows_in, stages = counted
    table = _partition_table(frame, pipeline.schema, p, lo, hi, len(job.shards), stages[-1].rows_out if stages else rows_in)
    return write_partition(job, pipeline, step, sort_partition(table, step.order), counted, p, count, out, stop, progress)


def _step(pipeline: Pipeline) -> KeyedStep:
    from etl.preprocess.keyed import keyed_step  # it imports etl.preprocess.run, which imports the tasks

    step = keyed_step(pipeline)
    if step is None:
        raise ValueError("the pipeline has no keyed step")
    return step


def _frame(table: pa.Table, part: np.ndarray) -> pd.DataFrame:
    """Spilled rows (``table``) with their partitions as a pandas DataFrame with Arrow dtypes."""
    import pandas as pd

    return table.append_column(PART, pa.array(part, pa.int64())).to_pandas(types_mapper=pd.ArrowDtype)


def _partition_table(frame: pd.DataFrame, schema: Schema, p: int, lo: int, hi: int, inputs: int, expected: int) -> pa.Table:
    """The shuffled rows of partition ``p`` (``frame``, indexed by partition) as a spilled table, checked: rows of
    partition ``p`` only, of buckets [lo, hi), ``expected`` of them, each with a position in the ``inputs`` shards."""
    where = f"partition {p} of the shuffle"
    if not (frame.index == p).all():
        raise RuntimeError(f"{where}: holds rows of other partitions")
    expected_schema = spill_schema(schema)
    try:
        table = pa.Table.from_pandas(frame, schema=expected_schema, preserve_index=False).replace_schema_metadata(None)
    except (pa.ArrowException, KeyError) as e:
        raise RuntimeError(f"{where}: not the spilled rows of this run ({e})") from None
    b = row_buckets(table)
    if table.num_rows != expected or np.any((b < lo) | (b >= hi)):
        raise RuntimeError(f"{where}: {table.num_rows} rows, of buckets {int(b.min(initial=lo))}..{int(b.max(initial=lo))}; "
                           f"expected {expected} of buckets {lo}..{hi - 1}")  # fmt: skip
    positions = [table.column(c) for c in (INPUT, ROW)]
    if any(c.null_count for c in positions) or (table.num_rows and (pc.min(positions[0]).as_py() < 0 or pc.max(positions[0]).as_py() >= inputs)):
        raise RuntimeError(f"{where}: rows without a position in the {inputs} input shards")
    return table
