"""``etl preprocess --follow``: preprocess the shards of a directory as a producer adds them, appending to the output.

The input is one directory followed as the loader follows it (``etl.io.arrivals``: shards in name order, each once
complete, i.e. renamed onto its ``*.parquet`` name; or, with ``arrivals="manifest"``, in the order the producer's
manifest lists them, each once listed). The ``i``-th shard to arrive becomes output file ``i``, written
and committed by the rules of ``etl.preprocess`` (``process_shard``, ``commit_shard``; a temporary name, then the
rename, then the manifest rewritten atomically), so each output file holds the same bytes as ``etl preprocess``
makes from the same shard, and the output of a run over shards that were all present at its start is the one
``etl preprocess`` makes. The pipeline must be fitted before (``--artifacts``) or have nothing to fit (hashing):
the artifacts are saved once, at the start, and every shard is transformed with them. A pipeline with History or
Groupby, which need every row of a key, is refused before anything is read (``ConfigError``).

The manifest lists the files committed so far; it says ``complete`` while every shard seen has its file (between
a shard's arrival and its commit, and after a stop that abandoned one, it does not). A run stops when its ``stop``
event is set (the CLI sets it on SIGINT and SIGTERM): the shards being transformed are abandoned (their
temporaries removed) and the manifest is left listing what was committed; or after ``stop_after_idle`` seconds
without a new shard. A rerun keeps the files an earlier run committed (the same checks as a rerun of
``etl preprocess``) and goes on from there.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

from etl.errors import ConfigError
from etl.io.arrivals import Arrivals
from etl.io.files import check_no_linked_directories, remove_temporaries
from etl.io.fs import Location
from etl.io.lock import locked
from etl.io.processed import QUARANTINE, Manifest, ManifestEntry, Totals, part_path, write_manifest
from etl.pipeline import OnError, Pipeline
from etl.preprocess.output import check_apart, is_complete, previous_run, remove_stale, save_artifacts
from etl.preprocess.shard import Formats, commit_shard, discard_shard, process_shard
from etl.runtime.workers import run_workers


@dataclass(frozen=True)
class FollowSummary:
    """What a following run did: shards seen, files kept from an earlier run, files committed now, and the row
    totals of every file the manifest lists."""

    files: int
    files_kept: int
    files_committed: int
    totals: Totals


class _EitherStop:
    """Set when either event is: the run's stop and the stop of a group of worker threads."""

    def __init__(self, *events: threading.Event):
        self.events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


def preprocess_follow(pipeline: Pipeline, directory: Location, out_dir: Location, *, stop: threading.Event, poll_interval: float = 1.0,
                      stop_after_idle: float | None = None, workers: int = 1, on_error: OnError = "raise",
                      compression: str = "none", arrivals: str = "names") -> FollowSummary:  # fmt: skip
    """Transform the shards of ``directory`` into ``out_dir`` as they arrive in the ``arrivals`` order (see the
    module docstring), listing the directory every ``poll_interval`` seconds, ``workers`` shards at a time, until
    ``stop`` is set or no shard has arrived for ``stop_after_idle`` seconds. Holds ``out_dir``'s lock throughout."""
    keyed = "Groupby" if pipeline.groupby is not None else next((op.name for op in pipeline.ops if op.keyed), None)
    if keyed is not None:
        raise ConfigError(f"{pipeline.name}: {keyed} needs every row of a key, and following transforms each shard alone as it arrives: "
                          "run etl preprocess over the shards (without --follow)")  # fmt: skip
    if not pipeline.is_fitted:
        raise ConfigError(f"{pipeline.name}: following needs a fitted pipeline (--artifacts from etl fit) or one with nothing to fit")
    if not poll_interval > 0:
        raise ConfigError(f"poll_interval must be > 0, got {poll_interval}")
    shards = Arrivals(directory, arrivals)
    check_apart(out_dir, [directory])
    out_dir.mkdir(parents=True, exist_ok=True)
    with locked(out_dir):
        return _Follower(pipeline, shards, out_dir, on_error, compression).run(stop, poll_interval, stop_after_idle, workers)


class _Follower:
    """The state of a following run: the manifest's entries, the shards seen, the artifacts' checksum."""

    def __init__(self, pipeline: Pipeline, arrivals: Arrivals, out_dir: Location, on_error: OnError, compression: str):
        self.pipeline, self.out_dir, self.on_error, self.compression = pipeline, out_dir, on_error, compression
        self.arrivals = arrivals
        self.entries: dict[str, ManifestEntry] = {}
        self.kept = self.committed = 0
        self.taken_over = False  # see _take_over
        self.lock = threading.Lock()
        check_no_linked_directories(out_dir)  # before anything is written or removed there
        remove_temporaries(out_dir)  # left by an interrupted run
        remove_temporaries(out_dir / QUARANTINE)
        self.previous, formats = previous_run(out_dir)
        self.same_formats = formats == Formats()  # Parquet only, as a following run writes; otherwise every shard is redone
        self.artifacts_sha = save_artifacts(pipeline, out_dir)

    def run(self, stop: threading.Event, poll_interval: float, stop_after_idle: float | None, workers: int) -> FollowSummary:
        last_arrival = time.monotonic()
        if not self.previous:  # nothing earlier to keep whole: the manifest is there from the start, for readers
            self._take_over()
        while not stop.is_set():
            start = len(self.arrivals.names)
            new = list(enumerate(self.arrivals.poll(), start))
            todo = [(i, src) for i, src in new if not self._keep(i, src)]
            if not todo:
                with self.lock:
                    self._take_over()
            if new:
                last_arrival = time.monotonic()
            if todo:
                run_workers(todo, workers, lambda w, item, group: self._process(*item, _EitherStop(stop, group)))
                continue
            if stop_after_idle is not None and time.monotonic() - last_arrival >= stop_after_idle:
                break
            stop.wait(poll_interval)
        return FollowSummary(len(self.arrivals.names), self.kept, self.committed, Totals.of(list(self.entries.values())))

    def _keep(self, index: int, source: Location) -> bool:
        """Whether the earlier run's file for shard ``index`` stands (then it is listed again as it was)."""
        out = part_path(self.out_dir, index)
        e = self.previous.get(out.name)
        if e is None or not self.same_formats or e.artifacts_sha256 != self.artifacts_sha:
            return False
        if not is_complete(e, source, out, self.on_error, parquet=True, npy=False):
            return False
        self.entries[out.name] = e
        self.kept += 1
        return True

    def _process(self, index: int, source: Location, stop: _EitherStop) -> None:
        """Transform shard ``index`` and commit its file (nothing when stopped first)."""
        written = process_shard(self.pipeline, source, part_path(self.out_dir, index), self.on_error, stop, self.compression)
        if written is None:
            return
        with self.lock:
            if stop.is_set() and not self.taken_over:  # another shard failed (or the run stops) first: see _take_over
                discard_shard(written)
                return
            self._take_over()
            entry = commit_shard(self.out_dir, written)
            self.entries[entry.output] = replace(entry, artifacts_sha256=self.artifacts_sha)
            self.committed += 1
            self._save_manifest()

    def _take_over(self) -> None:
        """Remove the earlier run's files that this run does not keep and list what it keeps: once, just before this
        run commits its first file, or at a poll that leaves nothing to transform (at the start when there is no
        earlier run). A run that fails or stops before then (its first shard raising with ``--on-error raise``
        where the earlier run quarantined rows, say) leaves the earlier output whole, its manifest included."""
        if not self.taken_over:
            remove_stale(self.out_dir, self.previous, set(self.entries))
            self._save_manifest()
            self.taken_over = True

    def _save_manifest(self) -> None:
        files = list(self.entries.values())  # Manifest.of puts them in shard order
        write_manifest(self.out_dir, Manifest.of(self.pipeline.name, files, complete=len(files) == len(self.arrivals.names)))
