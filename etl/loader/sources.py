"""Where a loader's rows come from: a ``Source``, one class per kind, each built by a classmethod (``open``) that
checks the arguments of its own kind, so that a source that exists can be read.

- ``ShardSource``: raw Parquet shards and the fitted pipeline that transforms them, on the host, or partly
  (``transform="device"``) or wholly (``"cudf"``) on the device;
- ``ProcessedSource``: the output directory of ``etl preprocess``, read as is (its Parquet files, or its npy chunks);
- ``FollowedSource``: a directory followed as it fills (``etl.loader.follow``): raw shards, or the output of
  ``etl preprocess --follow``.

What a loader asks of each (the ``Source`` protocol): its pipeline and layout, a reader of its pieces
(``etl.loader.pieces``), the number of batches of a pass, a new pass from a position, and its position as
``state_dict`` saves it and as ``load_state_dict`` restores it. Shards and processed outputs are read in epochs
(``EpochSource``: an epoch's order is a pure function of (files, seed, epoch, rank, world size), a position is
(epoch, batch)); a followed directory is one stream that never ends, its position a ``FollowPosition``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from etl.errors import ArtifactError, ConfigError
from etl.io.arrivals import PROCESSED, CountedFiles
from etl.io.files import sha256_file
from etl.io.fs import Location, Url
from etl.io.parquet import list_shards
from etl.io.processed import ARTIFACTS, ProcessedOutput, is_processed, open_processed
from etl.loader import cudf_columns
from etl.loader.chunk import Chunk, Layout
from etl.loader.device_stage import DeviceStage
from etl.loader.epoch import EpochPass, InlinePass
from etl.loader.follow import FollowCursor, FollowPass, FollowSettings
from etl.loader.follow_position import FollowPosition
from etl.loader.order import Piece, RowGroup, chunk_groups, row_groups
from etl.loader.pieces import NpyReader, reader_for
from etl.loader.ring import Ring
from etl.loader.settings import Batching
from etl.loader.stats import LoaderStats
from etl.loader.stream_state import Key, StreamPass
from etl.ops.history import History
from etl.ops.stream import describe_specs, stream_specs
from etl.pipeline import Pipeline, check_match

#: A pass of the default engine, whatever its source.
Pass = EpochPass | InlinePass | FollowPass


@dataclass(frozen=True)
class Workers:
    """What a pass runs with: ``read`` (piece → chunk, on ``num_workers`` threads, or in the consumer's thread
    with none), the ``ring`` its batches go to, ``prefetch`` pieces read ahead, ``io_bound``: one thread per
    piece in flight (``etl.loader.epoch.EpochPass``)."""

    read: Callable[[Piece], Chunk]
    ring: Ring
    stats: LoaderStats
    num_workers: int
    prefetch: int
    io_bound: bool


@dataclass(frozen=True)
class Resume:
    """A position read from a ``state_dict``, not yet taken: batch ``position`` of ``epoch``, or, following, the
    position ``follow`` in the stream."""

    epoch: int
    position: int
    follow: FollowPosition | None = None


class Source(Protocol):
    """What a loader reads (see the module docstring)."""

    pipeline: Pipeline
    layout: Layout
    groups: list[RowGroup]  #: the row groups (or npy chunks) of an epoch; none for a followed directory
    stage: DeviceStage | None  #: the pipeline's device part (``transform="device"`` or ``"cudf"``)
    remote: bool  #: in object storage: reads wait on requests
    epochs: bool  #: read in epochs (else one never-ending stream)

    @property
    def output(self) -> ProcessedOutput | None:
        """The processed output read, if any."""
        ...

    @property
    def total_rows(self) -> int:
        """The rows of an epoch over every rank (0 for a followed directory)."""
        ...

    def reader(self, stats: LoaderStats) -> Callable[[Piece], Chunk]:
        """A reader of this source's pieces, transformed as far as its batches need (``etl.loader.pieces``)."""
        ...

    def length(self, batching: Batching) -> int:
        """Batches per epoch on every rank; ``TypeError`` for a stream without end."""
        ...

    def new_pass(self, batching: Batching, epoch: int, start: int, workers: Workers, *, after: threading.Event | None = None,
                 streams: StreamPass | None = None) -> Pass:  # fmt: skip
        """A pass of ``epoch`` from batch ``start`` (a followed directory: from its saved position); it takes ring
        slots once ``after`` (if given) is set; ``streams``: its use of the loader's streaming states."""
        ...

    def vocab_key(self, batching: Batching, epoch: int, position: int) -> Key:
        """Where the streaming states' state at batch ``position`` of ``epoch`` is kept (``etl.loader.stream_state``)."""
        ...

    def position_state(self, epoch: int, position: int) -> dict[str, Any]:
        """The position part of ``Loader.state_dict``."""
        ...

    def position_from(self, state: dict[str, Any]) -> Resume:
        """The position ``state`` holds, checked (``ConfigError``), not yet taken."""
        ...

    def seek(self, resume: Resume) -> None:
        """Take the position ``resume`` (the next pass starts there)."""
        ...


class EpochSource:
    """A source read in epochs: ``groups`` in file order, split and ordered per epoch by ``etl.loader.order``."""

    epochs = True
    stage: DeviceStage | None = None

    def __init__(self, pipeline: Pipeline, groups: list[RowGroup], output: ProcessedOutput | None, remote: bool):
        self.pipeline, self.groups, self.output, self.remote = pipeline, groups, output, remote
        self.layout = Layout.of(pipeline, raw=output is None)

    @property
    def total_rows(self) -> int:
        return sum(g.num_rows for g in self.groups)

    def length(self, batching: Batching) -> int:
        return batching.length(self.total_rows)

    def new_pass(self, batching: Batching, epoch: int, start: int, workers: Workers, *, after: threading.Event | None = None,
                 streams: StreamPass | None = None) -> EpochPass | InlinePass:  # fmt: skip
        """Without worker threads, a pass run by the consumer's calls (never one that waits for another)."""
        settings = batching.pass_settings(epoch, start, self.length(batching))
        w = workers
        empty = self.stage.inputs.empty() if self.stage is not None else self.layout.empty()
        if w.num_workers == 0:
            return InlinePass(settings, self.groups, w.read, w.ring, w.stats, stage=self.stage, empty=empty, streams=streams)
        return EpochPass(settings, self.groups, w.read, w.ring, w.stats, num_workers=w.num_workers, prefetch=w.prefetch,
                         stage=self.stage, empty=empty, after=after, io_bound=w.io_bound, streams=streams)  # fmt: skip

    def vocab_key(self, batching: Batching, epoch: int, position: int) -> Key:
        return epoch, min(position, self.length(batching))

    def position_state(self, epoch: int, position: int) -> dict[str, Any]:
        return {"epoch": epoch, "position": position, "total_rows": self.total_rows}

    def position_from(self, state: dict[str, Any]) -> Resume:
        try:
            return Resume(int(state["epoch"]), int(state["position"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"state_dict: malformed epoch or position: {e!r}") from None

    def seek(self, resume: Resume) -> None:
        """Nothing to take: the loader's epoch and position are the position."""


class ShardSource(EpochSource):
    """Raw Parquet shards, transformed by a fitted pipeline: on the host (``transform="host"``), partly on
    ``device`` (``"device"``: ``etl.loader.device_stage``) or read into device memory by cudf (``"cudf"``:
    ``etl.loader.device_columns``)."""

    def __init__(self, pipeline: Pipeline, shards: list[Location], transform: str, device: torch.device):
        remote = any(isinstance(path, Url) for path in shards)  # reads wait on requests: see EpochPass io_bound
        layout = Layout.of(pipeline)
        if layout.streamed and transform != "host":
            states = describe_specs(stream_specs(pipeline.ops))
            raise ConfigError(f"streaming states ({states}) give their values on the host: use transform_on='host'")
        if transform == "cudf":
            if remote:
                raise ConfigError("reader='cudf' reads local files; this source is in object storage")
            why = cudf_columns.unavailable(device, pipeline.schema)
            if why is not None:
                raise ConfigError(why)
        super().__init__(pipeline, row_groups(shards), None, remote)
        self.transform, self.device = transform, device
        self.stage = DeviceStage(pipeline, self.layout, self.groups) if transform != "host" else None

    @classmethod
    def open(cls, items: list[Location], pipeline: str | Path | None, artifacts: Location | None, transform: str,
             device: torch.device) -> ShardSource:  # fmt: skip
        """The shards of ``items`` (directories or files), transformed by ``pipeline`` (fitted: loaded from
        ``artifacts``, which must match it, unless it has nothing to fit)."""
        return cls(raw_pipeline(pipeline, artifacts), list_shards(items), transform, device)

    def reader(self, stats: LoaderStats) -> Callable[[Piece], Chunk]:
        read_columns = cudf_columns.read_columns if self.transform == "cudf" else None
        return reader_for(self.pipeline, self.layout, processed=None, stage=self.stage, groups=self.groups, stats=stats,
                          device=self.device, read_columns=read_columns)  # fmt: skip


class ProcessedSource(EpochSource):
    """The output of ``etl preprocess``, read as is: its Parquet files, or, with ``chunks`` or for an npy-only
    output, its npy chunks (``etl.loader.order.chunk_groups``). Each file is checked against its manifest's sha256
    before its rows are used."""

    output: ProcessedOutput

    def __init__(self, pipeline: Pipeline, output: ProcessedOutput, *, chunks: bool = False):
        self.chunks = chunks or "parquet" not in output.manifest.formats
        super().__init__(pipeline, chunk_groups(output) if self.chunks else row_groups(output.parts), output,
                         any(isinstance(path, Url) for path in output.parts))  # fmt: skip

    @classmethod
    def open(cls, directory: Location, pipeline: str | Path | None, artifacts: Location | None, allow_partial: bool,
             transform: str = "host", *, chunks: bool = False) -> ProcessedSource:  # fmt: skip
        """The processed output in ``directory`` (refused unless complete, without ``allow_partial``);
        ``pipeline`` and ``artifacts``, when given, must be the ones it was made with (``ArtifactError``)."""
        if transform != "host":
            raise ConfigError("transform_on='device' transforms raw shards; this source is already transformed")
        fitted, output = open_processed_with(directory, pipeline, artifacts, allow_partial)
        return cls(fitted, output, chunks=chunks)

    def reader(self, stats: LoaderStats) -> Callable[[Piece], Chunk]:
        if self.chunks:
            return NpyReader(self.layout, stats, self.output)
        return reader_for(self.pipeline, self.layout, processed=self.output, stage=None, groups=self.groups, stats=stats)


def open_source(items: list[Location], pipeline: str | Path | None, artifacts: Location | None, *, allow_partial: bool,
                transform: str, device: torch.device) -> ShardSource | ProcessedSource:  # fmt: skip
    """The source of ``Loader(items, ...)`` without ``follow``: a processed output when ``items`` is one (detected by
    its manifest.json), else raw shards."""
    if len(items) == 1 and is_processed(items[0]):
        return ProcessedSource.open(items[0], pipeline, artifacts, allow_partial, transform)
    return ShardSource.open(items, pipeline, artifacts, transform, device)


class FollowedSource:
    """A directory followed as it fills (``etl.loader.follow``): raw shards in the arrival order of ``settings``,
    or the output of ``etl preprocess --follow`` in its own order (``etl.io.arrivals.PROCESSED``), its files checked
    against the manifest entries they were counted with (``counted``). One stream without epochs; ``cursor``
    holds the position after the last batch handed out."""

    epochs = False
    stage: DeviceStage | None = None
    total_rows = 0

    def __init__(self, pipeline: Pipeline, directory: Location, output: ProcessedOutput | None, settings: FollowSettings):
        self.pipeline, self.directory, self.output, self.settings = pipeline, directory, output, settings
        self.groups: list[RowGroup] = []
        self.layout = Layout.of(pipeline, raw=output is None)
        self.remote = isinstance(directory, Url)
        # a followed output: the entries its files were counted with, which the reader checks them against
        self.counted = CountedFiles() if output is not None else None
        self.cursor = FollowCursor(FollowPosition())

    @classmethod
    def open(cls, items: list[Location], pipeline: str | Path | None, artifacts: Location | None, settings: FollowSettings, *,
             num_workers: int, transform: str) -> FollowedSource:  # fmt: skip
        """``items`` must be one directory of raw shards (it may hold no shard yet; in object storage, a prefix that
        may hold no object yet) or the output of ``etl preprocess`` (``etl preprocess --follow`` writes its
        manifest.json when it starts). Following needs worker threads and host transforms."""
        if num_workers < 1 or transform != "host":
            raise ConfigError(f"follow=True needs num_workers >= 1 and host transforms (transform='host'), got num_workers={num_workers}, "
                              f"transform={transform!r}")  # fmt: skip
        if len(items) != 1:
            raise ConfigError(f"follow=True follows one directory, got {len(items)} sources")
        directory = items[0]
        if directory.is_file() or (isinstance(directory, Path) and not directory.is_dir()):  # an empty prefix is no "directory" in a store
            raise ConfigError(f"{directory}: follow=True follows a directory of raw shards or the output of etl preprocess, and this is not one")
        if not is_processed(directory):
            return cls(raw_pipeline(pipeline, artifacts), directory, None, settings)
        if settings.arrivals != "names":
            raise ConfigError(f"{directory}: the output of etl preprocess is followed in its own order; arrivals={settings.arrivals!r} "
                              "is for raw shards")  # fmt: skip
        # before the artifacts are loaded: should a rerun replace them in between, its files are refused, never taken
        artifacts_sha256 = _artifacts_sha256(directory)
        fitted, processed = open_processed_with(directory, pipeline, artifacts, allow_partial=True)
        if "parquet" not in processed.manifest.formats:
            raise ConfigError(f"{directory}: follow=True reads the Parquet files of an etl preprocess output, and this one has none")
        return cls(fitted, directory, processed, replace(settings, arrivals=PROCESSED, artifacts_sha256=artifacts_sha256))

    def reader(self, stats: LoaderStats) -> Callable[[Piece], Chunk]:
        return reader_for(self.pipeline, self.layout, processed=self.output, stage=None, groups=[], stats=stats, counted=self.counted)

    def length(self, batching: Batching) -> int:
        raise TypeError("a following loader (follow=True) has no length: its stream never ends")

    def new_pass(self, batching: Batching, epoch: int, start: int, workers: Workers, *, after: threading.Event | None = None,
                 streams: StreamPass | None = None) -> FollowPass:  # fmt: skip
        """A following pass from the position after the last batch handed out (``epoch`` and ``start`` have no
        meaning here)."""
        w = workers
        settings = batching.pass_settings(0, 0, sys.maxsize)
        return FollowPass(settings, self.settings, self.directory, self.cursor.position, w.read, w.ring, w.stats, self.cursor,
                          num_workers=w.num_workers, prefetch=w.prefetch, empty=self.layout.empty(), io_bound=w.io_bound,
                          streams=streams, counted=self.counted)  # fmt: skip

    def vocab_key(self, batching: Batching, epoch: int, position: int) -> Key:
        return self.cursor.position

    def position_state(self, epoch: int, position: int) -> dict[str, Any]:
        return {"follow": self.cursor.position.to_dict(), "arrivals": self.settings.arrivals}

    def position_from(self, state: dict[str, Any]) -> Resume:
        return Resume(0, 0, FollowPosition.from_dict(state["follow"]))

    def seek(self, resume: Resume) -> None:
        if resume.follow is not None:
            self.cursor.position = resume.follow


def open_processed_with(directory: Location, pipeline: str | Path | None, artifacts: Location | None,
                        allow_partial: bool) -> tuple[Pipeline, ProcessedOutput]:  # fmt: skip
    """The processed output in ``directory`` and the fitted pipeline it was made with, which ``pipeline`` and
    ``artifacts``, when given, must match (``ArtifactError``)."""
    processed = open_processed(directory, allow_partial=allow_partial)
    fitted = Pipeline.load(processed.artifacts)
    if pipeline is not None:
        check_match(fitted, Pipeline.from_file(pipeline), processed.artifacts)
    if artifacts is not None and _read_bytes(artifacts / "pipeline.json") != _read_bytes(processed.artifacts / "pipeline.json"):
        raise ArtifactError(f"{artifacts}: not the artifacts {directory} was made with ({processed.artifacts})")
    return fitted, processed


def raw_pipeline(pipeline: str | Path | None, artifacts: Location | None) -> Pipeline:
    """The fitted pipeline that transforms raw shards: loaded from ``artifacts`` (checked against ``pipeline``), or
    ``pipeline`` itself when it has nothing to fit. A pipeline with reshaping stages is refused (``ConfigError``):
    the loader streams raw rows through the ops only, and their output is made by ``etl preprocess``; so is a
    History the loader cannot run as a streaming state (``History.check_streamed``), and more than one History."""
    if pipeline is None:
        raise ConfigError("raw shards need a pipeline (or give the output directory of etl preprocess)")
    p = Pipeline.load(artifacts) if artifacts is not None else Pipeline.from_file(pipeline)
    if artifacts is not None:
        check_match(p, Pipeline.from_file(pipeline), artifacts)
    if p.groupby is not None:  # a reshaping stage of key scope: its rows are made by etl preprocess only
        raise ConfigError(f"{pipeline} ends with Groupby, which makes one row per group of events: the loader does not run it on raw shards; "
                          "run `etl preprocess` first, then load its output directory")  # fmt: skip
    if p.stages:
        names = ", ".join(s.name for s in p.stages)
        raise ConfigError(f"{pipeline} has reshaping stages ({names}), which the loader does not run on raw shards: run `etl preprocess` "
                          "first, then load its output directory")  # fmt: skip
    histories = [op for op in p.ops if isinstance(op, History)]
    if len(histories) > 1:  # their states would read one key hash and time (etl.ops.history: KEY_HASH, RAW_TIME)
        raise ConfigError(f"{pipeline} has {len(histories)} History ops; the loader on raw shards (as etl preprocess) runs at most one")
    for i, op in enumerate(p.ops):
        if isinstance(op, History):
            op.check_streamed(p.ops[i + 1 :])
        elif op.keyed:
            raise ConfigError(f"{pipeline} has a {op.name} op, which needs every row of a key: the loader does not run it on raw "
                              "shards; run `etl preprocess` first, then load its output directory")  # fmt: skip
    if not p.is_fitted:
        raise ConfigError(f"{pipeline} has ops to fit: run `etl fit` and pass artifacts=")
    return p


def _artifacts_sha256(directory: Location) -> str:
    """The checksum of the artifacts' pipeline.json of the processed output in ``directory`` (as its manifest
    entries record it, ``ManifestEntry.artifacts_sha256``)."""
    path = directory / ARTIFACTS / "pipeline.json"
    try:
        return sha256_file(path)
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read: {e.strerror or e}") from None


def _read_bytes(path: Location) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read: {e.strerror or e}") from None
