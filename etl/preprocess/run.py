"""``etl preprocess`` over a list of shards: check the arguments, lock the output directory, fit (the single pass
in threads, or on a Dask cluster) unless artifacts are given, then transform every shard not already complete, in
threads or as cluster tasks, committing each with the manifest (see the package docstring, ``etl.preprocess``).
"""

from __future__ import annotations

import functools
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from etl.errors import ConfigError, InputError
from etl.io.files import check_no_linked_directories, remove_temporaries
from etl.io.fs import Location
from etl.io.lock import locked
from etl.io.npy import DEFAULT_CHUNK_ROWS, NPY_DIR, NpySpec
from etl.io.parquet import Shard
from etl.io.processed import (
    ARTIFACTS,
    FORMATS,
    QUARANTINE,
    Manifest,
    ManifestEntry,
    SplitReport,
    StageRows,
    Totals,
    part_path,
    read_manifest,
    write_manifest,
)
from etl.ops.stream import describe_specs, stream_specs
from etl.pipeline import ON_ERROR, OnError, Pipeline, Transformed, check_match
from etl.pipeline.single_pass import Plan, fit_stashing, transform_stashed
from etl.pipeline.split_rows import SplitStage
from etl.pipeline.stash import Stash, default_budget, default_stash_budget, parse_budget
from etl.preprocess.output import check_apart, is_complete, previous_run, remove_stale, save_artifacts
from etl.preprocess.shard import Formats, RowGroupTransform, WrittenShard, commit_shard, discard_shard, fixed_columns, process_shard
from etl.runtime.cluster_tasks import run_tasks
from etl.runtime.progress import Progress
from etl.runtime.workers import run_workers

if TYPE_CHECKING:
    from distributed import Client


COMPRESSIONS = ("none", "snappy", "lz4", "zstd")


@dataclass
class Summary:
    """Totals over all shards (skipped ones included); ``rows_processed`` counts the shards transformed now.
    ``fit_seconds`` is None when this run fitted nothing (artifacts given, or a pipeline without ops to fit).
    ``stages``: the rows in and out of each reshaping stage (None without stages): ``rows_in = rows_out +
    rows_quarantined`` plus the rows they removed. ``warnings``: what the fit (this run's, or the artifacts') found
    doubtful, one line each (a column whose normalized values collapse...)."""

    files: int
    files_skipped: int
    rows_in: int
    rows_out: int
    rows_quarantined: int
    rows_processed: int
    fit_seconds: float | None
    transform_seconds: float
    #: the single pass's stash: the most bytes it held in memory at once, the bytes it wrote to disk, its budget
    stash_peak_bytes: int = 0
    stash_spilled_bytes: int = 0
    memory_budget: int = 0
    stages: tuple[StageRows, ...] | None = None
    #: what the fit found doubtful about the fitted state (``Pipeline.fit_warnings``; kept in the artifacts)
    warnings: tuple[str, ...] = ()
    #: a split run's outputs (``etl.preprocess.split``), in ``SPLITS`` order; empty for a run without a split
    splits: tuple[SplitPart, ...] = ()

    @property
    def rows_per_second(self) -> float:
        """Rows transformed in this run per second of transform (fit excluded)."""
        return self.rows_processed / self.transform_seconds if self.transform_seconds > 0 else 0.0


@dataclass
class SplitPart:
    """One split of a split run: its ``role`` (train, valid or test), the ``directory`` it was written to, the
    ``summary`` of that output and its ``report`` (as its manifest holds it)."""

    role: str
    directory: Location
    summary: Summary
    report: SplitReport


def parse_formats(text: str) -> tuple[str, ...]:
    """``--format``'s value (comma-separated, such as ``parquet,npy``) as formats in ``FORMATS`` order; ValueError
    for an unknown or missing one."""
    names = {f.strip() for f in text.split(",") if f.strip()}
    unknown = sorted(names - set(FORMATS))
    if unknown or not names:
        raise ValueError(f"format must be one or more of {', '.join(FORMATS)} separated by commas, got {text!r}")
    return tuple(f for f in FORMATS if f in names)


def preprocess(
    pipeline: Pipeline,
    shards: list[Location],
    out_dir: Location,
    *,
    artifacts: Location | None = None,
    workers: int = 1,
    on_error: OnError = "raise",
    compression: str = "none",
    progress: Progress | None = None,
    client: Client | None = None,
    partitions: int | None = None,
    memory_budget: int | str | None = None,
    formats: tuple[str, ...] = ("parquet",),
    npy_chunk_rows: int = DEFAULT_CHUNK_ROWS,
    training: bool | None = None,
    split: Mapping[str, Any] | str | None = None,
) -> Summary:
    """Fit (unless ``artifacts`` holds a fitted state of this pipeline), then transform every shard: in
    ``workers`` threads, or, given a Dask ``client``, on its cluster (the fit as ``Pipeline.fit`` does it with a
    client, count tables in ``partitions`` partitions spilled inside ``out_dir``; then one task per shard). The
    output bytes are the same either way.

    In threads, a fit reads each shard once: what the transform needs is stashed while fitting
    (``etl.pipeline.single_pass``), in memory up to ``memory_budget`` bytes (an int, or text such as ``"512M"``,
    ``"2G"``; default ``etl.pipeline.stash.default_stash_budget()``, 64 MiB; the keyed steps' default is
    ``default_budget()``, a quarter of the memory), beyond it in a
    temporary directory inside ``out_dir`` (the system's temporary directory when ``out_dir`` is in object
    storage), removed when the run ends, however it ends. A fit on a Dask cluster reads the shards twice (fit,
    then transform); with artifacts, or a pipeline with nothing to fit, there is one pass anyway.

    ``progress`` (``etl.runtime.progress``) hears of the fitting passes and of the ``"transform"`` pass, which counts the
    rows of the shards a previous run completed (skipped now) at its start.

    ``out_dir`` must lie apart from the inputs (OutputError otherwise, see ``check_apart``). The run holds
    ``out_dir``'s lock (``etl.io.lock``) throughout: a second run into the same directory raises
    OutputError at once (object storage has no such lock: one run at a time is up to the user there). A pipeline
    with a streaming state (``etl.ops.stream``: an online vocabulary, Categorify ``online: true``) is refused
    (``ConfigError``) before anything is written.

    ``formats``: some of ``etl.io.processed.FORMATS``: ``"parquet"`` (the default), ``"npy"`` (chunks of
    ``npy_chunk_rows`` rows, see ``etl.io.npy``; a pipeline with list columns raises ``ListColumnsError`` once it is
    fitted, before any shard is written), or both.
    A rerun with other formats (or chunk rows) than the earlier run's redoes every shard.

    ``training``: whether the rows are transformed as training rows (``Pipeline.transform(..., training=True)``:
    TargetEncode's out-of-fold encodings). None (the default): they are when this run fits the pipeline (the rows
    it fits on are training rows), they are not when the pipeline comes fitted or ``artifacts`` are given
    (validation, test or new rows: the full statistics). For a pipeline where it matters (``training_differs``) the
    manifest records it, and a rerun that transforms otherwise redoes every shard. With a split, the train rows
    are training rows and the others are not (``training`` must then be None).

    ``split`` (a split section, ``etl.pipeline.split``: a mapping, or ``--split``'s text), or the pipeline's own
    ``split``: write ``out_dir/train``, ``out_dir/valid`` and ``out_dir/test`` instead, each a processed output,
    with every statistic fitted on the train rows only (``etl.preprocess.split``; no ``artifacts`` then). The
    summary's ``splits`` holds each one's summary and report."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    if not formats or list(formats) != [f for f in FORMATS if f in formats]:
        raise ValueError(f"formats must be some of {FORMATS}, in that order, got {formats!r}")
    budget = default_budget() if memory_budget is None else parse_budget(memory_budget)
    streamed = stream_specs([op for op in pipeline.ops if not op.keyed])  # a keyed op's state runs here over sorted rows (keyed)
    if streamed:
        raise ConfigError(f"{describe_specs(streamed)}: such values are given by etl.Loader as it "
                          "streams rows, not by etl preprocess")  # fmt: skip
    stash_budget = default_stash_budget() if memory_budget is None else None
    run = RunSettings(shards, out_dir, workers, on_error, compression, progress, client, partitions, training, stash_budget=stash_budget)
    if split is not None or pipeline.split_spec is not None:
        from etl.preprocess.split import preprocess_split  # it imports this module

        return preprocess_split(pipeline, split, run, artifacts, budget, formats, npy_chunk_rows)
    return write_output(pipeline, run, artifacts, budget, formats, npy_chunk_rows)


def write_output(pipeline: Pipeline, run: RunSettings, artifacts: Location | None, budget: int, formats: tuple[str, ...],
                 npy_chunk_rows: int) -> Summary:  # fmt: skip
    """``preprocess`` once its arguments are checked: lock ``run.out_dir`` and write the output there (through the
    exchange by key for a pipeline with a keyed step)."""
    keyed = any(op.keyed for op in pipeline.ops) or pipeline.groupby is not None
    if keyed:  # the exchange by key and its pyarrow.compute are imported only for the pipelines that need them
        from etl.preprocess.keyed import check_keyed, preprocess_keyed  # it imports this module

        keyed = check_keyed(pipeline, formats)
    out_dir = run.out_dir
    check_apart(out_dir, run.shards)
    out_dir.mkdir(parents=True, exist_ok=True)
    with locked(out_dir):
        if keyed:
            _remove_temporaries(out_dir)
            return preprocess_keyed(run, pipeline, artifacts, budget)
        return _preprocess(run, pipeline, artifacts, budget, formats, npy_chunk_rows)


@dataclass(frozen=True)
class RunSettings:
    """A run's inputs, output directory and how it works, as ``preprocess`` was called (checked): the ``shards``
    (input order: shard ``i`` becomes ``outputs[i]``), ``out_dir``, ``workers`` threads (or the cluster of
    ``client``, its count tables in ``partitions`` partitions), ``on_error``, the Parquet ``compression`` and the
    ``progress`` callback; ``training``: as given to ``preprocess`` (None: the default). ``split_stage``: for one
    split of a split run (``etl.preprocess.split``), the stage that passes on its rows: the pipeline's last row-scope
    stage, which a task on a cluster adds to the pipeline it loads, and, for a pipeline with a keyed step, applied
    after that step instead (which sees every row)."""

    shards: list[Location]
    out_dir: Location
    workers: int
    on_error: OnError
    compression: str
    progress: Progress | None
    client: Client | None
    partitions: int | None
    training: bool | None = None
    split_stage: SplitStage | None = None
    #: the budget of the single pass's stash when it is not the memory budget (None: it is)
    stash_budget: int | None = None

    @property
    def outputs(self) -> list[Location]:
        """The processed file of each shard, in shard order."""
        return [part_path(self.out_dir, i) for i in range(len(self.shards))]


def _npy_spec(pipeline: Pipeline, chunk_rows: int) -> NpySpec:
    """The npy spec of the output of the fitted ``pipeline``; ``ListColumnsError`` when it has list columns."""
    return NpySpec.of(fixed_columns(pipeline), chunk_rows)


def _preprocess(run: RunSettings, pipeline: Pipeline, artifacts: Location | None, memory_budget: int, format_names: tuple[str, ...],
                npy_chunk_rows: int) -> Summary:  # fmt: skip
    """``preprocess`` once the arguments are checked and ``run.out_dir`` is locked."""
    out_dir, shards, on_error = run.out_dir, run.shards, run.on_error
    check_no_linked_directories(out_dir)  # before anything is written or removed there
    _remove_temporaries(out_dir)
    previous, before = previous_run(out_dir)
    outputs = run.outputs
    # the shards whose earlier output may be kept; whether the npy spec is the earlier run's is known once the fit
    # has fixed the id dtype (then ``same_formats``)
    parquet, npy = "parquet" in format_names, "npy" in format_names
    complete = set()
    if before is not None and before.parquet == parquet and (before.npy is not None) == npy:
        for i, (src, out) in enumerate(zip(shards, outputs)):
            e = previous.get(out.name)
            if e is not None and is_complete(e, src, out, on_error, parquet, npy):
                complete.add(i)
    if run.stash_budget is not None:
        memory_budget = run.stash_budget
    with Stash(memory_budget, out_dir if isinstance(out_dir, Path) else Path(tempfile.gettempdir())) as stash, \
            ThreadPoolExecutor(1, thread_name_prefix="etl-save") as saver:  # fmt: skip
        pipeline, plan, fit_seconds = _fitted(run, pipeline, artifacts, stash, complete)
        training = run.training if run.training is not None else fit_seconds is not None
        recorded = training if pipeline.training_differs else None  # what the manifest says of it
        formats = Formats(parquet, _npy_spec(pipeline, npy_chunk_rows) if npy else None)
        saved = saver.submit(save_artifacts, pipeline, out_dir)
        # Threads transform while the artifacts are saved (a shard is committed once they are); a rerun needs
        # their checksum first to know which shards it keeps, and tasks on a cluster load them.
        same_formats = formats == before  # the npy spec's id dtype is final now that the pipeline is fitted
        same_rows = recorded == _previous_training(out_dir)  # training rows then as now
        reused = [i for i in sorted(complete) if same_formats and same_rows and previous[outputs[i].name].artifacts_sha256 == saved.result()]
        todo = [i for i in range(len(shards)) if i not in reused]
        if run.client is not None or not todo:
            saved.result()

        def transform(i: int) -> RowGroupTransform | None:
            """How the row groups of shard ``i`` are transformed: from the stash when the fit stashed them."""
            if plan is None or i in complete:
                return None
            return functools.partial(_transform_from_stash, pipeline, plan, stash, i, on_error, training)

        kept = {outputs[i].name: previous[outputs[i].name] for i in reused}
        summary = _transform(run, pipeline, kept, previous, todo, saved.result, transform, formats, training)
        saved.result()  # its error, when no shard was committed to raise it
        return replace(summary, fit_seconds=fit_seconds, stash_peak_bytes=stash.peak_bytes, stash_spilled_bytes=stash.spilled_bytes,
                       memory_budget=memory_budget, warnings=tuple(pipeline.fit_warnings))  # fmt: skip


def _previous_training(out_dir: Location) -> bool | None:
    """What the manifest an earlier run left in ``out_dir`` says of its rows (``Manifest.training``; None when it
    says nothing, or there is no usable manifest)."""
    try:
        return read_manifest(out_dir).training
    except InputError:
        return None


def _remove_temporaries(out_dir: Location) -> None:
    """Remove what an interrupted run left under temporary names in ``out_dir`` (a stash's spill directory, an
    exchange directory among them), its quarantine and npy directories."""
    remove_temporaries(out_dir)
    remove_temporaries(out_dir / QUARANTINE)
    if (out_dir / NPY_DIR).is_dir():
        for d in (out_dir / NPY_DIR).iterdir():
            remove_temporaries(d)


def _fitted(run: RunSettings, pipeline: Pipeline, artifacts: Location | None, stash: Stash,
            complete: set[int]) -> tuple[Pipeline, Plan | None, float | None]:  # fmt: skip
    """The fitted pipeline (loaded from ``artifacts``, or ``pipeline`` fitted now unless it is fitted already),
    the plan of the transform from ``stash`` (None when nothing was stashed) and the seconds the fit took (None
    when nothing was fitted). Without ``run.client``, the fit stashes the row groups of the shards not ``complete``."""
    if artifacts is not None:
        fitted = Pipeline.load(artifacts)
        check_match(fitted, pipeline, artifacts)
        return fitted, None, None
    if pipeline.is_fitted:
        return pipeline, None, None
    t0 = time.perf_counter()
    plan = None
    if run.client is None:
        plan = fit_stashing(pipeline, run.shards, stash, set(range(len(run.shards))) - complete, run.workers, run.on_error, run.progress)
    else:
        # the count tables spill inside out_dir (a URL too)
        pipeline.fit(run.shards, workers=run.workers, on_error=run.on_error, progress=run.progress, client=run.client, partitions=run.partitions,
                     workdir=run.out_dir)  # fmt: skip
    return pipeline, plan, time.perf_counter() - t0


def _transform_from_stash(
    pipeline: Pipeline, plan: Plan, stash: Stash, index: int, on_error: OnError, training: bool, shard: Shard, i: int
) -> tuple[int, Transformed, pa.Table | None]:
    """The ``RowGroupTransform`` of shard ``index``'s row groups stashed by the fit (each taken out of ``stash``)."""
    return transform_stashed(pipeline, plan, stash.pop((index, i)), shard, on_error, training)


def _transform(
    run: RunSettings,
    pipeline: Pipeline,
    entries: dict[str, ManifestEntry],
    previous: dict[str, ManifestEntry],
    todo: list[int],
    artifacts_sha: Callable[[], str],
    transform: Callable[[int], RowGroupTransform | None],
    formats: Formats,
    training: bool,
) -> Summary:
    """Write the shards ``todo`` (``entries``: those of the others, kept from the earlier run's ``previous``
    ones), with ``transform(i)`` for shard ``i`` in threads, or on the cluster of ``run.client`` (as training rows
    when ``training``). ``artifacts_sha()``
    is the checksum of the saved artifacts: the first shard committed waits for it (the save may still run while
    shards are transformed), so a manifest lists a shard only once the artifacts it was made with are saved; it
    raises what failed the save."""
    shards, outputs, out_dir, on_error, compression = run.shards, run.outputs, run.out_dir, run.on_error, run.compression
    lock = threading.Lock()

    def save_manifest() -> None:
        files = list(entries.values())  # Manifest.of puts them in shard order
        write_manifest(out_dir, Manifest.of(pipeline.name, files, complete=len(files) == len(shards), formats=formats.names, npy=formats.npy,
                                            training=training if pipeline.training_differs else None))  # fmt: skip

    transformed = None if run.progress is None else functools.partial(run.progress, "transform")
    if transformed is not None and len(entries):
        transformed(sum(e.rows_in for e in entries.values()))

    taken_over = False

    def take_over() -> None:
        """Remove the earlier run's files that this run does not keep and list what it keeps (``entries`` then):
        once, just before this run commits its first shard, or at once when it has none to write or there is no
        earlier run. A run that fails or stops before then leaves the earlier output whole, its manifest included."""
        nonlocal taken_over
        if not taken_over:
            remove_stale(out_dir, previous, set(entries))
            save_manifest()
            taken_over = True

    def record(i: int, written: WrittenShard | None, failed: threading.Event | None = None) -> None:
        """Commit the output of shard ``i`` and list it in the manifest (nothing when it was stopped). When another
        shard has failed already (``failed`` is set) and nothing is committed yet, the output is discarded instead:
        committing it would take the earlier output over for a run that fails."""
        if written is None:
            return
        if written.entry.output != outputs[i].name:
            raise RuntimeError(f"{shards[i]}: its task wrote {written.entry.output}, expected {outputs[i].name}")
        try:
            sha = artifacts_sha()
        except BaseException:  # the save failed: the shard is not committed
            discard_shard(written)
            raise
        with lock:
            if failed is not None and failed.is_set() and not taken_over:
                discard_shard(written)
                return
            take_over()
            entry = commit_shard(out_dir, written)
            entries[entry.output] = replace(entry, artifacts_sha256=sha)
            save_manifest()

    def work(w: int, i: int, stop: threading.Event) -> None:
        record(i, process_shard(pipeline, shards[i], outputs[i], on_error, stop, compression, transformed, transform(i), formats, training), stop)

    t1 = time.perf_counter()
    if not todo or not previous:  # nothing to write, or no earlier output to keep whole until the first commit
        take_over()
    if run.client is None:
        run_workers(todo, run.workers, work)
    else:
        from etl.preprocess.tasks import shard_task  # it imports this module

        task = functools.partial(shard_task, out_dir / ARTIFACTS, artifacts_sha(), uuid.uuid4().hex, on_error, compression, formats, training,
                                 run.split_stage)  # fmt: skip
        try:
            run_tasks(run.client, task, [(shards[i], outputs[i]) for i in todo], lambda k, w: record(todo[k], w), transformed,
                      describe=lambda shard: str(shard[0]))  # fmt: skip
        finally:  # what the attempts of tasks whose worker died, or that were stopped, left behind
            remove_temporaries(out_dir)
            remove_temporaries(out_dir / QUARANTINE)
    seconds = time.perf_counter() - t1
    totals = Totals.of(list(entries.values()))
    return Summary(
        files=len(shards),
        files_skipped=len(shards) - len(todo),
        rows_in=totals.rows_in,
        rows_out=totals.rows_out,
        rows_quarantined=totals.rows_quarantined,
        stages=totals.stages,
        fit_seconds=None,
        transform_seconds=seconds,
        rows_processed=sum(entries[outputs[i].name].rows_in for i in todo),
    )

