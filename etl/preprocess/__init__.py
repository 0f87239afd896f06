"""Offline preprocessing: raw Parquet shards → processed Parquet shards and/or npy chunks, resumable.

The output directory is a processed output (layout and manifest: ``etl.io.processed``): one processed file per
input shard (input order) with one row group per input row group, and/or, with the npy format, the same rows as
fixed-width .npy chunks (``etl.io.npy``); the quarantine files hold the rejected raw rows with _row (row number in
the source), _column and _reason. The Parquet files are the same bytes whether or not the npy chunks are written.

Every file is written under a unique temporary name; the driver (the process that called ``preprocess``, sole
owner of the manifest and of the directory's lock) renames it onto its final name and rewrites the manifest
(atomically) after each shard. The manifest written last is the commit record: readers trust only the files it
lists. Shards are transformed by worker threads, or, given a Dask ``client`` (``etl.runtime.cluster``), by tasks on its
workers, each loading the fitted pipeline from the artifacts this run saved (``etl.preprocess.tasks``): the input and output
paths must then name the same files on every worker (shared storage). A task whose worker dies is run again
elsewhere, and what the killed attempt left under a temporary name is removed at the end of the run. In threads,
the fitted artifacts are saved (in a thread of their own) while the first shards are transformed; a shard is
committed only once they are saved, and a rerun, which must compare their checksum with the manifest's first,
waits for the save.

A fit in threads reads each shard once (``etl.pipeline.single_pass``): it stashes the row groups it read
(``etl.pipeline.stash``: in memory within ``memory_budget``, beyond it in a temporary directory inside the output
directory, removed when the run ends, however it ends), and each shard's output is written from its stash, the
same bytes as a transform that reads the shard again; a row group where the stashed transform rejects a row is
read again and transformed the two-pass way. A fit on a Dask cluster, and a run without a fit, read each shard
for the transform (``transform_read``).

A rerun skips the shards whose manifest entry still matches (``etl.preprocess.output.is_complete``: the same source
file by path, size, modification time and footer checksum, not changed since its output was written (a local file's
status change time), the output present with the recorded checksum, and no quarantined row when the rerun's
``on_error`` is "raise"; and the same fitted artifacts), so a run killed at any point and rerun ends with the same
bytes as an uninterrupted run. A rerun that fits again stashes only the shards it has to redo. A rerun removes the
earlier run's files it does not keep, and rewrites the manifest, only just before it commits its first shard: a
rerun that fails or is stopped before then (``--on-error raise`` over shards that quarantined rows, say) leaves the
earlier output whole; a shard finished after another failed is discarded then, not committed. Rows are accounted
exactly: rows_in = rows_out + rows_quarantined + the rows the pipeline's reshaping stages removed
(``etl.pipeline.stages``; each stage's rows in and out are in the manifest).

Nothing is written or removed outside the output directory: a run refuses a directory under it that is a symbolic
link (``etl.io.files.check_no_linked_directories``) before it writes or removes anything there.

In object storage (``etl.io.fs``) the "rename" is a copy onto the final key, where the file appears whole.

Modules: ``run`` (the run over a list of shards), ``shard`` (one shard: transform, write, commit), ``output`` (the
output directory across runs), ``tasks`` (a shard task on a Dask worker), ``follow`` (``--follow``).
"""

from etl.preprocess.output import check_apart
from etl.preprocess.run import COMPRESSIONS, Summary, parse_formats, preprocess

__all__ = ["COMPRESSIONS", "Summary", "check_apart", "parse_formats", "preprocess"]
