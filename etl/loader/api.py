"""The streaming loader: Parquet shards → transformed fixed-size batches in a ring of (pinned) slots → the device.

    loader = etl.Loader("data/raw", pipeline="pipelines/criteo.yaml", artifacts="artifacts/",
                        batch_size=65536, shuffle=True, seed=0, device="cuda", num_workers=2)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:     # batch.label [B] f32, batch.dense [B, D] f32, batch.sparse [B, S] int32/int64
            ...
    state = loader.state_dict()  # exact position, a few numbers

How it works: ``etl.loader.order`` fixes which row-group pieces this rank reads, in which order. Each iteration is
one pass (``etl.loader.epoch.EpochPass``; with ``num_workers=0``, ``InlinePass``, which does the same work in the
training loop's thread when it asks for a batch, like torch's DataLoader): ``num_workers`` threads read and transform the pieces
(``etl.loader.pieces``; Parquet decoding and the numba kernels release the GIL), at most ``num_workers + prefetch``
ahead of the assembler (from object storage, each of those pieces has a thread of its own, so that their requests
overlap and hide the store's latency). One assembler thread (``etl.loader.assembler``) gathers their rows in order into shuffle
buffers of ``shuffle_buffer`` rows, permutes each buffer with a generator drawn from (seed, epoch, rank, buffer
number), cuts ``batch_size``-row batches (the remainder carries over across pieces and shards), copies each into a
free slot of ``etl.loader.ring.Ring`` and starts its host→device copy. The consumer (this module: position,
``LoaderBatch``) waits only when no batch is ready. Once a pass has handed its last piece to the workers, the next
epoch's pass starts reading (its batches enter the ring after this pass's last one), so an epoch does not begin
with a wait for its first shuffle buffer. Only this module knows ``Loader``: the other modules get what they need
as arguments (see ``etl.loader`` for the list).

With ``transform_on="device"`` the workers run only the host part of the pipeline (label check, decoding text into
keys) and the rest runs on the device right after each slot's copy, on the copy's side stream
(``etl.loader.device_stage``); the CPU then only reads and decodes. The batches are the same, bit for bit.

A batch's tensors live in a reused slot: they are valid until the next batch is requested (``.clone()`` to keep
them, or ``copy=True``: every batch then owns its tensors).
Every batch is a pure function of (files, seed, epoch, rank, world size, batch number), so ``state_dict`` is that
and resuming recomputes the order and skips ahead, re-reading at most one shuffle buffer.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from etl.allocator import tune_allocator
from etl.errors import ArtifactError, ConfigError
from etl.io.fs import Location, Url, location, locations
from etl.io.parquet import list_shards
from etl.io.processed import ProcessedOutput, is_processed, open_processed
from etl.loader.assembler import PassSettings
from etl.loader.chunk import Chunk, Layout
from etl.loader.device_stage import DeviceStage
from etl.loader.epoch import EpochPass, InlinePass
from etl.loader.order import Piece, batches_per_rank, chunk_groups, row_groups
from etl.loader.pieces import guarded, reader_for
from etl.loader.ring import Ring
from etl.loader.stats import LoaderStats
from etl.pipeline import Pipeline, check_match

__all__ = ["Loader", "LoaderBatch", "LoaderStats"]


@dataclass
class LoaderBatch:
    """One batch: ``label`` [B] float32, ``dense`` [B, D] float32, ``sparse`` [B, S] ids (columns in the order of
    ``Loader.layout``), ``lists``: multi-hot columns as (values, offsets[B + 1]), ``sparse_names`` their names.

    Passthrough columns (schema role ``passthrough``, such as a row id) are not in loader batches: the loader does
    not read them from raw shards nor from a processed output. They serve the offline path: ``etl preprocess``
    writes them, unchanged, beside the transformed columns of each row.

    ``label``, ``dense`` and ``sparse`` are views of a ring slot that the loader reuses: the next batch (the next
    ``next()`` on the loader's iterator) overwrites them. Keep a batch by cloning its tensors, or build the loader
    with ``copy=True``, whose batches own their tensors. The ``lists`` tensors are made for each batch."""

    label: torch.Tensor
    dense: torch.Tensor
    sparse: torch.Tensor
    lists: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    sparse_names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.label.shape[0]

    def to_kjt(self) -> Any:
        """The sparse and list columns as a TorchRec ``KeyedJaggedTensor`` (keys: sparse columns, then lists;
        values key-major). Needs torchrec installed."""
        try:
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
        except ImportError as e:
            raise ImportError("LoaderBatch.to_kjt needs torchrec (pip install torchrec)") from e
        ids = self.sparse.long()
        values = [ids.t().reshape(-1)] + [v.long() for v, _ in self.lists.values()]
        lengths = [torch.ones(ids.numel(), dtype=torch.int32, device=ids.device)]
        lengths += [(o[1:] - o[:-1]).to(torch.int32) for _, o in self.lists.values()]
        return KeyedJaggedTensor.from_lengths_sync(keys=self.sparse_names + list(self.lists), values=torch.cat(values), lengths=torch.cat(lengths))


class Loader:
    """Iterate over Parquet shards as transformed batches on ``device``. See the module docstring.

    ``source``: raw shards (a directory or files; needs ``pipeline``, and ``artifacts`` unless every op is
    fit-free) or the output directory of ``etl preprocess`` (detected by its manifest.json; read as is).
    ``rank``/``world_size`` default to ``torch.distributed`` when it is initialised, else 0/1.
    ``transform_on``: ``"host"`` (worker threads run the whole pipeline) or ``"device"`` (they run only its host
    part; the rest runs on ``device`` after the copy, with the torch backend; raw shards only).
    ``allow_partial``: read a processed output whose run did not complete (refused by default: its manifest lists
    only the files done). Each file of a processed output is checked against its manifest's sha256 before its
    rows are used; a ``pipeline`` (or ``artifacts``) given with one must be the one it was made with
    (``ArtifactError`` otherwise). ``num_workers=0`` reads and transforms in the calling thread, when a batch is
    asked for (the same batches as with worker threads). ``copy``: hand out batches that own their tensors
    instead of views of the reused ring slot (see ``LoaderBatch``). A setting that cannot work raises
    ``ConfigError``, among them a ``batch_size`` larger than a rank's rows with ``drop_last`` (no batch at all);
    without ``drop_last`` such a rank yields one short batch. ``source`` and ``artifacts`` may be object-storage
    URLs (``s3://bucket/raw``, ``gs://...``, see ``etl.io.fs``), with ``storage_options`` for their filesystem
    (credentials and endpoints otherwise come from the environment, e.g. ``AWS_ENDPOINT_URL``); from object storage,
    ``num_workers + prefetch`` pieces are read at once, so that their requests overlap (with ``num_workers=0`` each
    request's latency is the training loop's). ``engine="dali"`` reads the npy chunks of a processed output
    with NVIDIA DALI instead (``etl.loader.dali.DaliLoader``, the same ``LoaderBatch`` fields)."""

    def __new__(cls, *args: Any, engine: str = "default", **kwargs: Any) -> Loader:
        """A ``Loader``, or with ``engine="dali"`` the ``DaliLoader`` subclass (imported, with DALI, only then)."""
        if engine == "dali" and cls is Loader:
            from etl.loader.dali import DaliLoader

            return super().__new__(DaliLoader)
        if engine not in ("default", "dali"):
            raise ConfigError(f"engine must be 'default' or 'dali', got {engine!r}")
        return super().__new__(cls)

    def __init__(
        self,
        source: str | Location | list[str | Location],
        pipeline: str | Path | None = None,
        artifacts: str | Location | None = None,
        *,
        batch_size: int = 65536,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_buffer: int | None = None,
        drop_last: bool = False,
        device: str | torch.device = "cpu",
        num_workers: int = 2,
        prefetch: int = 4,
        rank: int | None = None,
        world_size: int | None = None,
        transform_on: str = "host",
        allow_partial: bool = False,
        copy: bool = False,
        storage_options: dict[str, Any] | None = None,
        engine: str = "default",
    ):
        tune_allocator()
        if batch_size < 1 or prefetch < 1:
            raise ConfigError(f"batch_size and prefetch must be >= 1, got batch_size={batch_size}, prefetch={prefetch}")
        if num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0 (0: no worker threads), got {num_workers}")
        if transform_on not in ("host", "device"):
            raise ConfigError(f"transform_on must be 'host' or 'device', got {transform_on!r}")
        self.pipeline, output, shards = _open_source(source, pipeline, artifacts, allow_partial, storage_options)
        self.processed = output is not None
        if transform_on == "device" and self.processed:
            raise ConfigError("transform_on='device' transforms raw shards; this source is already transformed")
        self.layout = Layout.of(self.pipeline)
        npy_only = output is not None and "parquet" not in output.manifest.formats  # read from its npy chunks
        self.groups = chunk_groups(output) if output is not None and npy_only else row_groups(shards)
        self.remote = any(isinstance(path, Url) for path in shards)  # reads wait on requests: see EpochPass io_bound
        self.stage = DeviceStage(self.pipeline, self.layout, self.groups) if transform_on == "device" else None
        self.total_rows = sum(g.num_rows for g in self.groups)
        self.rank, self.world_size = rank_and_world_size(rank, world_size, self.total_rows, batch_size, drop_last)
        self.batch_size, self.shuffle, self.seed, self.drop_last, self.copy = batch_size, shuffle, seed, drop_last, copy
        self.shuffle_buffer = max(shuffle_buffer or 4 * batch_size, 1)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {device!r}: torch {torch.__version__} sees no CUDA device")
        self.num_workers, self.prefetch = num_workers, prefetch
        self.epoch, self.position = 0, 0
        self._finished = False  # the last pass ran to its end: the next iteration starts the epoch over
        self.stats = LoaderStats()
        self._reader = reader_for(self.pipeline, self.layout, processed=output, stage=self.stage,
                                  groups=self.groups, stats=self.stats)  # fmt: skip
        self._ring: Ring | None = None
        self._active: weakref.ref[_Iteration] | None = None
        self._ahead: EpochPass | InlinePass | None = None  # epoch + 1, started while the current pass drains

    # ------------------------------------------------------------------ public
    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return batches_per_rank(self.total_rows, self.world_size, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration yields. Setting the current epoch keeps the position, so a loop
        that resumed with ``load_state_dict`` may call it as usual."""
        if epoch != self.epoch:
            self._close_active()
            if self._ahead is not None and self._ahead.epoch != epoch:
                self._close_ahead()
            self.epoch, self.position, self._finished = epoch, 0, False

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "batch_size": self.batch_size, "shuffle": self.shuffle,
                "shuffle_buffer": self.shuffle_buffer, "drop_last": self.drop_last, "total_rows": self.total_rows}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the loader that produced ``state`` stopped (same data and settings)."""
        mine = self.state_dict()
        for k in ("seed", "rank", "world_size", "batch_size", "shuffle", "shuffle_buffer", "drop_last", "total_rows"):
            if state[k] != mine[k]:
                raise ConfigError(f"state_dict mismatch on {k}: saved {state[k]!r}, this loader {mine[k]!r}")
        self.close()
        self.epoch, self.position, self._finished = int(state["epoch"]), int(state["position"]), False

    def __iter__(self) -> _Iteration:
        """Yield the rest of the current epoch (all of it when the previous pass ran to its end).

        Once a pass has handed all its pieces to the workers, the next epoch's pass starts in the background (its
        batches enter the ring only after this pass's last one), so that its first batches are ready when the
        training loop calls ``set_epoch(epoch + 1)`` and iterates again (any other next pass discards it)."""
        self._close_active()
        if self._finished:
            self.position, self._finished = 0, False
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.epoch == self.epoch and self.position == 0:
            epoch_pass = ahead
        else:
            if ahead is not None:
                ahead.close()
            self._slots().reclaim()  # slots a previous, abandoned pass still counted as taken
            epoch_pass = self._new_pass(self.epoch, self.position)
        it = _Iteration(self, epoch_pass)
        self._active = weakref.ref(it)
        return it

    def close(self) -> None:
        """Stop the background threads of the current iteration and of the next epoch's, if any (also done on
        break + garbage collection)."""
        self._close_active()
        self._close_ahead()

    # ------------------------------------------------------------------ passes
    def _slots(self) -> Ring:
        """The ring, made on first use: slots for the batch fields, or, with device placement, for the device
        stage's inputs and outputs."""
        if self._ring is None:
            if self.stage is not None:
                fields, outputs = self.stage.inputs.fields(), self.stage.outputs()
                self._ring = Ring(self.prefetch + 2, self.batch_size, fields, self.device, outputs)
            else:
                self._ring = Ring(self.prefetch + 2, self.batch_size, self.layout.batch_fields(), self.device)
        return self._ring

    def _new_pass(self, epoch: int, start: int, after: threading.Event | None = None) -> EpochPass | InlinePass:
        """A pass over ``epoch`` from batch ``start`` on; it takes ring slots once ``after`` (if given) is set.
        Without worker threads, a pass run by the consumer's calls (never one that waits for another)."""
        settings = PassSettings(epoch=epoch, start=start, total=len(self), batch_size=self.batch_size,
                                shuffle_buffer=self.shuffle_buffer, shuffle=self.shuffle, seed=self.seed, rank=self.rank,
                                world_size=self.world_size)  # fmt: skip
        empty = self.stage.inputs.empty() if self.stage is not None else self.layout.empty()
        if self.num_workers == 0:
            return InlinePass(settings, self.groups, guarded(_read_weakly(self)), self._slots(), self.stats, stage=self.stage, empty=empty)
        return EpochPass(settings, self.groups, guarded(_read_weakly(self)), self._slots(), self.stats, num_workers=self.num_workers,
                         prefetch=self.prefetch, stage=self.stage, empty=empty, after=after, io_bound=self.remote)  # fmt: skip

    def _close_active(self) -> None:
        it = self._active() if self._active is not None else None
        if it is not None:
            it.close()
        self._active = None

    def _close_ahead(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def _start_ahead(self, epoch: int, after: threading.Event) -> None:
        """Start epoch ``epoch`` from its beginning; its batches take ring slots once ``after`` is set (the
        current pass queued its last batch or was closed). Nothing runs in the background without worker threads."""
        if self._ahead is None and self.num_workers > 0:
            self._ahead = self._new_pass(epoch, 0, after)

    def _read_piece(self, piece: Piece) -> Chunk:
        """Read and transform one piece: what the workers of every pass call."""
        return self._reader(piece)


def rank_and_world_size(rank: int | None, world_size: int | None, total_rows: int, batch_size: int, drop_last: bool) -> tuple[int, int]:
    """This process's rank and the world size: as given, or both from ``torch.distributed`` when it is initialised
    (else 0 and 1). ``ConfigError`` for an impossible pair, or when ``drop_last`` leaves a rank of ``total_rows //
    world_size`` rows (the smallest slice, see ``batches_per_rank``) no batch of ``batch_size`` rows."""
    if rank is None and world_size is None:
        dist = torch.distributed.is_available() and torch.distributed.is_initialized()
        rank, world_size = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if dist else (0, 1)
    if rank is None or world_size is None or world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank and world_size must be given together with 0 <= rank < world_size, got {rank}, {world_size}")
    rows = total_rows // world_size
    if drop_last and batch_size > rows:
        raise ConfigError(f"batch_size={batch_size} is larger than the {rows} rows of a rank ({total_rows} rows over {world_size} "
                          "rank(s)): with drop_last=True no batch is left; use a smaller batch_size or drop_last=False")  # fmt: skip
    return rank, world_size


def _read_weakly(loader: Loader) -> Callable[[Piece], Chunk]:
    """``loader._read_piece`` called through a weak proxy of ``loader``. A pass's threads must hold no reference to
    the loader: none that keeps it alive, and none whose release on a worker thread frees the loader there (its
    passes' shutdown would then wait for that very thread)."""
    return functools.partial(type(loader)._read_piece, weakref.proxy(loader))


def _open_source(
    source: str | Location | list[str | Location],
    pipeline: str | Path | None,
    artifacts: str | Location | None,
    allow_partial: bool,
    storage_options: dict[str, Any] | None,
) -> tuple[Pipeline, ProcessedOutput | None, list[Location]]:
    """The pipeline, the processed output when the source is one (read as is), and the shards to read."""
    items = locations(source if isinstance(source, list) else [source], storage_options)
    if artifacts is not None:
        artifacts = location(artifacts, storage_options)
    if len(items) == 1 and is_processed(items[0]):
        processed = open_processed(items[0], allow_partial=allow_partial)
        fitted = Pipeline.load(processed.artifacts)
        if pipeline is not None:
            check_match(fitted, Pipeline.from_file(pipeline), processed.artifacts)
        if artifacts is not None and _read_bytes(artifacts / "pipeline.json") != _read_bytes(processed.artifacts / "pipeline.json"):
            raise ArtifactError(f"{artifacts}: not the artifacts {items[0]} was made with ({processed.artifacts})")
        return fitted, processed, processed.parts
    if pipeline is None:
        raise ConfigError("raw shards need a pipeline (or give the output directory of etl preprocess)")
    p = Pipeline.load(artifacts) if artifacts is not None else Pipeline.from_file(pipeline)
    if artifacts is not None:
        check_match(p, Pipeline.from_file(pipeline), artifacts)
    if not p.is_fitted:
        raise ConfigError(f"{pipeline} has ops to fit: run `etl fit` and pass artifacts=")
    return p, None, list_shards(items)


def _read_bytes(path: Location) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read: {e.strerror or e}") from None


class _Iteration:
    """The consumer's side of one pass: counts the loader's position, turns each ring slot into a ``LoaderBatch``,
    and starts the next epoch's pass once this one has submitted all its pieces."""

    def __init__(self, loader: Loader, epoch_pass: EpochPass | InlinePass):
        self.loader, self.epoch_pass = loader, epoch_pass
        self.last: float | None = None  # when the previous batch was returned (or the first next() began)

    def __iter__(self) -> _Iteration:
        return self

    def __next__(self) -> LoaderBatch:
        loader, epoch_pass = self.loader, self.epoch_pass
        epoch_pass.release()
        if loader.position >= epoch_pass.settings.total:
            self.close()
            loader._finished = True
            if self._is_active():
                loader._start_ahead(epoch_pass.epoch + 1, epoch_pass.assembled)  # if not started yet
            raise StopIteration
        t0 = time.perf_counter()
        self.last = self.last or t0
        try:
            slot, n, lists = epoch_pass.take()
        except Exception:
            if self._is_active():
                loader._close_ahead()  # an error ends the run: no next epoch in the background
            raise
        t1 = time.perf_counter()
        if epoch_pass.all_submitted.is_set() and self._is_active():
            loader._start_ahead(epoch_pass.epoch + 1, epoch_pass.assembled)
        tensors = epoch_pass.ring.view(slot, n)
        loader.position += 1
        now = time.perf_counter()
        loader.stats.add_batch(n, t1 - t0, now - self.last)
        self.last = now
        lists = {k: (v.to(loader.device, non_blocking=True), o.to(loader.device, non_blocking=True)) for k, (v, o) in lists.items()}
        if loader.stage is not None and loader.device.type == "cuda":
            for t in (t for pair in lists.values() for t in pair):  # made on the copy stream, used on the consumer's
                t.record_stream(torch.cuda.current_stream(loader.device))
        if loader.copy:  # owned tensors: the slot may take the next batch at once
            tensors = {k: tensors[k].clone() for k in ("label", "dense", "sparse")}
            epoch_pass.release()
        return LoaderBatch(tensors["label"], tensors["dense"], tensors["sparse"], lists, loader.layout.sparse)

    def _is_active(self) -> bool:
        """Whether this is the loader's current iteration (not superseded by a later ``iter``)."""
        return self.loader._active is not None and self.loader._active() is self

    def close(self) -> None:
        """Stop the pass and give back its ring slots."""
        self.epoch_pass.close()
