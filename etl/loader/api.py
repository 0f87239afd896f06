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
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from etl.errors import ArtifactError, ConfigError
from etl.io.arrivals import PROCESSED, CountedFiles, check_order
from etl.io.files import sha256_file
from etl.io.fs import Location, Url, location, locations
from etl.io.parquet import list_shards
from etl.io.processed import ARTIFACTS, ProcessedOutput, is_processed, open_processed
from etl.loader import cudf_columns
from etl.loader.assembler import PassSettings
from etl.loader.chunk import Chunk, Layout
from etl.loader.device_stage import DeviceStage
from etl.loader.epoch import EpochPass, InlinePass
from etl.loader.follow import FollowCursor, FollowPass, FollowPosition, FollowSettings
from etl.loader.online import Key, OnlineVocabularies
from etl.loader.order import Piece, batches_per_rank, chunk_groups, row_groups
from etl.loader.pieces import guarded, reader_for
from etl.loader.ring import Ring
from etl.loader.stats import LoaderStats
from etl.ops.online_vocab import VocabEvents
from etl.pipeline import Pipeline, check_match
from etl.runtime.allocator import tune_allocator

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
    with ``copy=True``, whose batches own their tensors. The ``lists`` tensors are made for each batch.

    ``vocab_events``: with online vocabularies (Categorify ``online: true``), one ``VocabEvents`` per online column
    (numpy arrays, in the order it happened: ``admitted_ids`` with ``admitted_keys``, ``evicted_ids`` with
    ``evicted_keys``; ids as ``sparse`` holds them): the ids given and taken back by this batch's rows, which get
    their ids in the batch's row order (``etl.loader.online``). An id evicted in a batch is given again only in a
    later one, so within a batch an id names one key. Reset the embedding rows of ``admitted_ids`` before training
    on the batch: no row of an evicted key uses its id in or after the batch that admits the new key. Empty without
    online columns."""

    label: torch.Tensor
    dense: torch.Tensor
    sparse: torch.Tensor
    lists: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    sparse_names: list[str] = field(default_factory=list)
    vocab_events: dict[str, VocabEvents] = field(default_factory=dict)

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
    part; the rest runs on ``device`` after the copy, with the torch backend; raw shards only). ``reader``:
    ``"cpu"`` (Parquet decoded on the CPU) or ``"cudf"`` (decoded by cudf straight into GPU memory, the host part
    run there too, then gathered and transformed on the device: ``etl.loader.device_columns``; needs
    ``transform_on="device"``, a CUDA ``device``, cudf installed, local files and no list column; the batches are
    the same).
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
    request's latency is the training loop's).

    ``follow=True``: follow a directory of raw shards that a producer keeps filling (``etl.loader.follow``): the
    shards present at start, then each new one once complete, in arrival order (``etl.io.arrivals``): with
    ``arrivals="names"`` (the default), in name order, each shard once renamed onto its ``*.parquet`` name; with
    ``arrivals="manifest"``, in the order the producer's manifest ``_arrivals.json`` lists them, each once listed
    (``etl.io.arrivals_manifest``; no shard before the producer writes it). The output directory of
    ``etl preprocess --follow`` (detected by its manifest.json, as without ``follow``) is followed in its own order:
    output file ``i`` (the ``i``-th input shard's rows, read as is and checked against its sha256 and the artifacts
    the loader opened) once its manifest lists it and every file before it; its batches are those of a loader
    following the input directory with the same settings. The directory is listed (the manifest read) every
    ``poll_interval`` seconds, and when no shard has arrived for ``idle_flush`` seconds (default:
    ``poll_interval``) the rows held in the shuffle buffer are delivered. Iteration never ends by itself (until
    ``close()`` or ``break``); ``state_dict`` then saves the position in the stream, and a loader given it with
    ``load_state_dict`` delivers every row not delivered before it exactly once. Needs ``num_workers >= 1`` and
    ``transform_on="host"``; ``len()`` and ``set_epoch`` have no meaning there. Online vocabularies grow over the
    stream as over an epoch, their state saved with the position (and by ``save_vocabulary``): a restarted loader
    gives the rows not yet delivered the ids and events of an uninterrupted one.

    ``engine="dali"`` reads the npy chunks of a processed output with NVIDIA DALI instead
    (``etl.loader.dali.DaliLoader``, the same ``LoaderBatch`` fields)."""

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
        reader: str = "cpu",
        allow_partial: bool = False,
        copy: bool = False,
        storage_options: dict[str, Any] | None = None,
        follow: bool = False,
        poll_interval: float = 1.0,
        idle_flush: float | None = None,
        arrivals: str = "names",
        engine: str = "default",
    ):
        tune_allocator()
        if batch_size < 1 or prefetch < 1:
            raise ConfigError(f"batch_size and prefetch must be >= 1, got batch_size={batch_size}, prefetch={prefetch}")
        if num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0 (0: no worker threads), got {num_workers}")
        if transform_on not in ("host", "device"):
            raise ConfigError(f"transform_on must be 'host' or 'device', got {transform_on!r}")
        self._follow = _follow_settings(follow, poll_interval, idle_flush, drop_last, num_workers, transform_on, arrivals)
        self._directory: Location | None = None  # follow mode: the directory followed
        shards: list[Location] = []
        if self._follow is not None:
            self.pipeline, self._directory, output, self._follow = _open_followed(source, pipeline, artifacts, storage_options, self._follow)
        else:
            self.pipeline, output, shards = _open_source(source, pipeline, artifacts, allow_partial, storage_options)
        self.processed = output is not None
        if transform_on == "device" and self.processed:
            raise ConfigError("transform_on='device' transforms raw shards; this source is already transformed")
        self.layout = Layout.of(self.pipeline)
        self.vocabularies = OnlineVocabularies(self.pipeline, list(self.layout.online), self.layout.sparse) if self.layout.online else None
        if self.vocabularies is not None and transform_on == "device":
            raise ConfigError("online vocabularies (Categorify online: true) give ids on the host: use transform_on='host'")
        npy_only = output is not None and "parquet" not in output.manifest.formats  # read from its npy chunks
        self.groups = chunk_groups(output) if output is not None and npy_only else row_groups(shards)
        self.remote = any(isinstance(path, Url) for path in shards)  # reads wait on requests: see EpochPass io_bound
        self.stage = DeviceStage(self.pipeline, self.layout, self.groups) if transform_on == "device" else None
        self.total_rows = sum(g.num_rows for g in self.groups)
        # a following loader has no fixed number of rows: drop_last leaves no rank without batches
        self.rank, self.world_size = rank_and_world_size(rank, world_size, self.total_rows, batch_size, drop_last and self._follow is None)
        if self.vocabularies is not None and self.world_size > 1:
            raise ConfigError(f"online vocabularies (Categorify online: true) follow one row stream: world_size must be 1, got {self.world_size}")
        self.batch_size, self.shuffle, self.seed, self.drop_last, self.copy = batch_size, shuffle, seed, drop_last, copy
        self.shuffle_buffer = max(shuffle_buffer or 4 * batch_size, 1)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {device!r}: torch {torch.__version__} sees no CUDA device")
        self.num_workers, self.prefetch = num_workers, prefetch
        self.epoch, self.position = 0, 0
        self._finished = False  # the last pass ran to its end: the next iteration starts the epoch over
        self.stats = LoaderStats()
        self._check_reader(reader, transform_on)
        # a followed output: the entries its files were counted with, which the reader checks them against
        self._counted = CountedFiles() if self._follow is not None and output is not None else None
        self._reader = reader_for(self.pipeline, self.layout, processed=output, stage=self.stage, groups=self.groups,
                                  stats=self.stats, device=self.device,
                                  read_columns=cudf_columns.read_columns if reader == "cudf" else None, counted=self._counted)  # fmt: skip
        self._ring: Ring | None = None
        self._active: weakref.ref[_Iteration] | None = None
        self._ahead: EpochPass | InlinePass | None = None  # epoch + 1, started while the current pass drains
        self._cursor = FollowCursor(FollowPosition())  # follow mode: the position after the last batch handed out

    # ------------------------------------------------------------------ public
    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank). A following loader has no length (TypeError)."""
        if self._follow is not None:
            raise TypeError("a following loader (follow=True) has no length: its stream never ends")
        return batches_per_rank(self.total_rows, self.world_size, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration yields. Setting the current epoch keeps the position, so a loop
        that resumed with ``load_state_dict`` may call it as usual. No effect on a following loader."""
        if epoch != self.epoch and self._follow is None:
            self._close_active()
            self._commit_vocabularies()
            if self._ahead is not None and self._ahead.epoch != epoch:
                self._close_ahead()
            self.epoch, self.position, self._finished = epoch, 0, False

    def state_dict(self) -> dict[str, Any]:
        """The loader's position and the settings it depends on; with online vocabularies, their state at this
        position under ``online_vocab`` (``OnlineVocabularies.to_dict``: ints and bytes, no pickled objects). In follow
        mode, ``follow`` (the position in the stream after the last batch handed out, see
        ``etl.loader.follow.FollowPosition``) and ``arrivals`` (the arrival order) replace epoch, position and
        total_rows: save it together with what the training did with that batch (a model checkpoint), never ahead of
        it, so that a restart neither loses nor repeats a row."""
        state = self._position_state()
        if self.vocabularies is not None:
            state["online_vocab"] = self.vocabularies.to_dict(self.vocabularies.at(self._vocab_here()))
        return state

    def _position_state(self) -> dict[str, Any]:
        """``state_dict`` without the online vocabularies."""
        state: dict[str, Any] = {"seed": self.seed, "rank": self.rank, "world_size": self.world_size, "batch_size": self.batch_size,
                                 "shuffle": self.shuffle, "shuffle_buffer": self.shuffle_buffer, "drop_last": self.drop_last}  # fmt: skip
        if self._follow is not None:
            state["follow"] = self._cursor.position.to_dict()
            state["arrivals"] = self._follow.arrivals
        else:
            state |= {"epoch": self.epoch, "position": self.position, "total_rows": self.total_rows}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the loader that produced ``state`` stopped (same data and settings). A state refused
        (``ConfigError``) leaves the position and the online vocabularies as they were."""
        mine = self._position_state()
        if ("follow" in state) != ("follow" in mine):
            raise ConfigError("state_dict mismatch: " + ("a following loader's state given to a loader without follow=True" if "follow" in state
                              else "the state of a loader without follow=True given to a following loader"))  # fmt: skip
        saved = {"arrivals": "names"} | state if "follow" in state else state  # a state saved before arrival orders: name order
        for k in ("seed", "rank", "world_size", "batch_size", "shuffle", "shuffle_buffer", "drop_last", "total_rows", "arrivals"):
            if k in mine and saved[k] != mine[k]:
                raise ConfigError(f"state_dict mismatch on {k}: saved {saved[k]!r}, this loader {mine[k]!r}")
        self.close()
        position = FollowPosition.from_dict(state["follow"]) if "follow" in state else None
        if position is None:  # read before anything changes: a state refused leaves the loader where it was
            try:
                epoch, batch = int(state["epoch"]), int(state["position"])
            except (KeyError, TypeError, ValueError) as e:
                raise ConfigError(f"state_dict: malformed epoch or position: {e!r}") from None
        if self.vocabularies is not None:
            if "online_vocab" not in state:
                raise ConfigError("state_dict has no online_vocab: it was saved by a loader without online vocabularies")
            self.vocabularies.load_dict(state["online_vocab"])
        if position is not None:
            self._cursor.position = position
        else:
            self.epoch, self.position, self._finished = epoch, batch, False

    def save_vocabulary(self, directory: str | Location) -> None:
        """Write the online vocabularies' state at this position (the one ``state_dict`` holds) as artifacts: JSON +
        one Parquet table per column (``etl.pipeline.artifacts.save_online``)."""
        if self.vocabularies is None:
            raise ConfigError("this loader's pipeline has no online vocabulary (Categorify online: true)")
        self.vocabularies.save(self.vocabularies.at(self._vocab_here()), directory)

    def load_vocabulary(self, directory: str | Location) -> None:
        """Continue from the online vocabularies saved by ``save_vocabulary`` (the next pass starts from them)."""
        if self.vocabularies is None:
            raise ConfigError("this loader's pipeline has no online vocabulary (Categorify online: true)")
        self.close()
        self.vocabularies.load(directory)

    def __iter__(self) -> _Iteration:
        """Yield the rest of the current epoch (all of it when the previous pass ran to its end).

        Once a pass has handed all its pieces to the workers, the next epoch's pass starts in the background (its
        batches enter the ring only after this pass's last one), so that its first batches are ready when the
        training loop calls ``set_epoch(epoch + 1)`` and iterates again (any other next pass discards it)."""
        self._close_active()
        if self._follow is not None:
            self._slots().reclaim()
            self._commit_vocabularies()
            it = _Iteration(self, self._follow_pass())
            self._active = weakref.ref(it)
            return it
        self._commit_vocabularies()
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
        break + garbage collection). With ``num_workers >= 1`` another thread may call it while the consumer waits
        for a batch (how a following loader is stopped): the consumer's loop then ends as after a last batch
        (``StopIteration``, within about 0.1 s), the position stays after the last batch handed out, and a later
        ``iter`` continues from there."""
        self._close_active()
        self._close_ahead()

    # ------------------------------------------------------------------ passes
    def _check_reader(self, reader: str, transform_on: str) -> None:
        """``ConfigError`` (one line) unless ``reader`` can read this loader's source here."""
        if reader not in ("cpu", "cudf"):
            raise ConfigError(f"reader must be 'cpu' or 'cudf', got {reader!r}")
        if reader == "cpu":
            return
        if transform_on != "device":
            raise ConfigError("reader='cudf' leaves the rows in GPU memory: it needs transform_on='device'")
        if self.remote:
            raise ConfigError("reader='cudf' reads local files; this source is in object storage")
        why = cudf_columns.unavailable(self.device, self.pipeline.schema)
        if why is not None:
            raise ConfigError(why)

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
        online = None
        if self.vocabularies is not None:
            online = self.vocabularies.start_pass(self._vocab_key(epoch, start))
        if self.num_workers == 0:
            return InlinePass(settings, self.groups, guarded(_read_weakly(self)), self._slots(), self.stats, stage=self.stage, empty=empty,
                              online=online)  # fmt: skip
        return EpochPass(settings, self.groups, guarded(_read_weakly(self)), self._slots(), self.stats, num_workers=self.num_workers,
                         prefetch=self.prefetch, stage=self.stage, empty=empty, after=after, io_bound=self.remote, online=online)  # fmt: skip

    def _vocab_key(self, epoch: int, position: int) -> Key:
        """Where the online vocabularies' state at batch ``position`` of ``epoch`` (after the batches before it) is
        kept (``etl.loader.online``)."""
        return epoch, min(position, len(self))

    def _vocab_here(self) -> Key:
        """Where the online vocabularies' state at the loader's position is kept: in follow mode, the position after
        the last batch handed out, else ``_vocab_key(epoch, position)``."""
        if self._follow is not None:
            return self._cursor.position
        return self._vocab_key(self.epoch, self.position)

    def _commit_vocabularies(self) -> None:
        """The next pass starts the online vocabularies from their state at this position."""
        if self.vocabularies is not None:
            self.vocabularies.commit(self._vocab_here())

    def _follow_pass(self) -> FollowPass:
        """A following pass from the position after the last batch handed out."""
        if self._follow is None or self._directory is None:
            raise RuntimeError("a following pass needs a following loader")
        settings = PassSettings(epoch=0, start=0, total=sys.maxsize, batch_size=self.batch_size, shuffle_buffer=self.shuffle_buffer,
                                shuffle=self.shuffle, seed=self.seed, rank=self.rank, world_size=self.world_size)  # fmt: skip
        start = self._cursor.position
        online = None
        if self.vocabularies is not None:
            online = self.vocabularies.start_pass(start)
        return FollowPass(settings, self._follow, self._directory, start, guarded(_read_weakly(self)), self._slots(),
                          self.stats, self._cursor, num_workers=self.num_workers, prefetch=self.prefetch, empty=self.layout.empty(),
                          io_bound=isinstance(self._directory, Url), online=online, counted=self._counted)  # fmt: skip

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
        current pass queued its last batch or was closed). Nothing runs in the background without worker threads,
        nor with online vocabularies (a pass must start from the state the one before it ends with)."""
        if self._ahead is None and self.num_workers > 0 and self.vocabularies is None:
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
        fitted, processed = _open_processed(items[0], pipeline, artifacts, allow_partial)
        return fitted, processed, processed.parts
    return _raw_pipeline(pipeline, artifacts), None, list_shards(items)


def _open_processed(directory: Location, pipeline: str | Path | None, artifacts: Location | None,
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


def _raw_pipeline(pipeline: str | Path | None, artifacts: Location | None) -> Pipeline:
    """The fitted pipeline that transforms raw shards: loaded from ``artifacts`` (checked against ``pipeline``), or
    ``pipeline`` itself when it has nothing to fit."""
    if pipeline is None:
        raise ConfigError("raw shards need a pipeline (or give the output directory of etl preprocess)")
    p = Pipeline.load(artifacts) if artifacts is not None else Pipeline.from_file(pipeline)
    if artifacts is not None:
        check_match(p, Pipeline.from_file(pipeline), artifacts)
    if not p.is_fitted:
        raise ConfigError(f"{pipeline} has ops to fit: run `etl fit` and pass artifacts=")
    return p


def _follow_settings(follow: bool, poll_interval: float, idle_flush: float | None, drop_last: bool, num_workers: int,
                     transform_on: str, arrivals: str) -> FollowSettings | None:  # fmt: skip
    """The settings of follow mode, checked; None without ``follow``."""
    check_order(arrivals)
    if not follow:
        if arrivals != "names":
            raise ConfigError(f"arrivals={arrivals!r} is an arrival order: it goes with follow=True")
        return None
    if not poll_interval > 0 or (idle_flush is not None and not idle_flush >= 0):
        raise ConfigError(f"poll_interval must be > 0 and idle_flush >= 0, got poll_interval={poll_interval}, idle_flush={idle_flush}")
    if num_workers < 1 or transform_on != "host":
        raise ConfigError(f"follow=True needs num_workers >= 1 and transform_on='host', got num_workers={num_workers}, transform_on={transform_on!r}")
    return FollowSettings(poll_interval, poll_interval if idle_flush is None else idle_flush, drop_last, arrivals)


def _open_followed(source: str | Location | list[str | Location], pipeline: str | Path | None, artifacts: str | Location | None,
                   storage_options: dict[str, Any] | None,
                   follow: FollowSettings) -> tuple[Pipeline, Location, ProcessedOutput | None, FollowSettings]:  # fmt: skip
    """The pipeline, the directory, the processed output (when the directory is one) and the settings of a
    following loader: ``source`` must be one directory of raw shards (it may hold no shard yet; in object storage,
    a prefix that may hold no object yet) or the output of ``etl preprocess`` (``etl preprocess --follow`` writes
    its manifest.json when it starts), followed in its own order (``etl.io.arrivals.PROCESSED``)."""
    items = locations(source if isinstance(source, list) else [source], storage_options)
    if len(items) != 1:
        raise ConfigError(f"follow=True follows one directory, got {len(items)} sources")
    directory = items[0]
    if directory.is_file() or (isinstance(directory, Path) and not directory.is_dir()):  # an empty prefix is no "directory" in a store
        raise ConfigError(f"{directory}: follow=True follows a directory of raw shards or the output of etl preprocess, and this is not one")
    saved = location(artifacts, storage_options) if artifacts is not None else None
    if not is_processed(directory):
        return _raw_pipeline(pipeline, saved), directory, None, follow
    if follow.arrivals != "names":
        raise ConfigError(f"{directory}: the output of etl preprocess is followed in its own order; arrivals={follow.arrivals!r} is for raw shards")
    # before the artifacts are loaded: should a rerun replace them in between, its files are refused, never taken
    artifacts_sha256 = _artifacts_sha256(directory)
    fitted, processed = _open_processed(directory, pipeline, saved, allow_partial=True)
    if "parquet" not in processed.manifest.formats:
        raise ConfigError(f"{directory}: follow=True reads the Parquet files of an etl preprocess output, and this one has none")
    return fitted, directory, processed, replace(follow, arrivals=PROCESSED, artifacts_sha256=artifacts_sha256)


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


class _Iteration:
    """The consumer's side of one pass: counts the loader's position, turns each ring slot into a ``LoaderBatch``,
    and starts the next epoch's pass once this one has submitted all its pieces."""

    def __init__(self, loader: Loader, epoch_pass: EpochPass | InlinePass | FollowPass):
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
            item = epoch_pass.take()
            if item is not None and item.check is not None:  # device placement: a NaN or ±inf found on the device is raised here
                item.check.raise_if_set()
        except Exception:
            epoch_pass.close()
            if self._is_active():
                loader._close_ahead()  # an error ends the run: no next epoch in the background
            raise
        if item is None:  # closed by another thread while this one waited: the loop ends here
            raise StopIteration
        t1 = time.perf_counter()
        if epoch_pass.all_submitted.is_set() and self._is_active():
            loader._start_ahead(epoch_pass.epoch + 1, epoch_pass.assembled)
        n = item.rows
        tensors = epoch_pass.ring.view(item.slot, n)
        loader.position += 1
        if loader.vocabularies is not None:
            loader.vocabularies.prune(loader._vocab_here())
        now = time.perf_counter()
        loader.stats.add_batch(n, t1 - t0, now - self.last)
        self.last = now
        lists = {k: (v.to(loader.device, non_blocking=True), o.to(loader.device, non_blocking=True)) for k, (v, o) in item.lists.items()}
        if loader.stage is not None and loader.device.type == "cuda":
            for t in (t for pair in lists.values() for t in pair):  # made on the copy stream, used on the consumer's
                t.record_stream(torch.cuda.current_stream(loader.device))
        if loader.copy:  # owned tensors: the slot may take the next batch at once
            tensors = {k: tensors[k].clone() for k in ("label", "dense", "sparse")}
            epoch_pass.release()
        return LoaderBatch(tensors["label"], tensors["dense"], tensors["sparse"], lists, loader.layout.sparse, item.events)

    def _is_active(self) -> bool:
        """Whether this is the loader's current iteration (not superseded by a later ``iter``)."""
        return self.loader._active is not None and self.loader._active() is self

    def close(self) -> None:
        """Stop the pass and give back its ring slots."""
        self.epoch_pass.close()
