"""What a Dask worker runs for ``etl.preprocess`` on a cluster: one shard task, with the fitted pipeline loaded once.

A worker process loads the fitted pipeline at its first task of a run and keeps it for the run's next tasks. It
keeps it across runs too while the artifacts hold the same bytes (a long-lived cluster running ``etl preprocess``
again with the same artifacts, e.g. on each new day of logs), since loading large vocabularies costs far more than
reading their bytes once to compare them. The memory of that pipeline stays with the worker process until a run with
other artifacts replaces it.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Callable, Iterator

from etl.errors import ConfigError
from etl.io.files import is_temporary, sha256_file
from etl.io.fs import Location
from etl.pipeline import OnError, Pipeline
from etl.pipeline.stages import Stage
from etl.preprocess.shard import Formats, WrittenShard, process_shard
from etl.runtime.allocator import tune_allocator
from etl.runtime.cluster_tasks import Stop

_lock = threading.Lock()
_loaded: tuple[str, str, Pipeline] | None = None  # (run, digest of the artifacts, pipeline) of the last load here


def shard_task(
    artifacts: Location,
    artifacts_sha: str,
    run: str,
    on_error: OnError,
    compression: str,
    formats: Formats,
    training: bool,
    split_stage: Stage | None,
    shard: tuple[Location, Location],
    stop: Stop,
    progress: Callable[[int], None],
) -> WrittenShard | None:
    """``process_shard`` for ``shard`` = (source, output path) (as training rows when ``training``), with the
    pipeline the run ``run`` saved in ``artifacts`` (see ``fitted``), its row-scope stages followed by ``split_stage``
    for one split of a split run. The worker process's allocator is tuned as the command line tunes its own
    (``etl.runtime.allocator``; Dask starts workers with malloc handing freed memory back at once, which makes every
    row group page-fault its arrays in again)."""
    tune_allocator()
    source, out = shard
    pipeline = fitted(artifacts, artifacts_sha, run)
    if split_stage is not None:
        pipeline = pipeline.with_stages([*pipeline.stages, split_stage])
    return process_shard(pipeline, source, out, on_error, stop, compression, progress, formats=formats, training=training)


def fitted(artifacts: Location, artifacts_sha: str, run: str) -> Pipeline:
    """The pipeline of ``artifacts`` as this worker sees them, which must be the ones the driver of run ``run``
    saved (their pipeline.json checksum is ``artifacts_sha``); loaded once per run, and not again in a later run
    whose artifacts hold the same bytes. A worker that cannot read them, or reads others, raises ``ConfigError``."""
    global _loaded
    with _lock:
        if _loaded is not None and _loaded[0] == run:
            return _loaded[2]
        where = f"--cluster worker on {socket.gethostname()}"
        shared = "every worker must see the input and output paths on shared storage, at the same paths as the driver"
        try:
            sha = sha256_file(artifacts / "pipeline.json")
            digest = _digest(artifacts)
        except OSError as e:
            raise ConfigError(f"{artifacts}: {where} cannot read the artifacts of this run ({e.strerror}); {shared}") from None
        if sha != artifacts_sha:
            raise ConfigError(f"{artifacts}: {where} sees other artifacts than those this run saved; {shared}")
        pipeline = _loaded[2] if _loaded is not None and _loaded[1] == digest else Pipeline.load(artifacts)
        _loaded = (run, digest, pipeline)
        return pipeline


def _digest(directory: Location) -> str:
    """sha256 over the relative path and the sha256 of every file under ``directory`` (temporaries left out)."""
    h = hashlib.sha256()
    root = len(str(directory)) + 1
    for p in _files(directory):
        if not is_temporary(p.name):
            h.update(f"{str(p)[root:]}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def _files(directory: Location) -> Iterator[Location]:
    """Every file under ``directory``, depth first in name order."""
    children: list[Location] = sorted(directory.iterdir(), key=str)
    for p in children:
        if p.is_dir():
            yield from _files(p)
        else:
            yield p
