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
free slot of ``etl.loader.ring.Ring`` and starts its host→device copy. The consumer (``etl.loader.threads``:
the iteration that turns slots into ``LoaderBatch``es) waits only when no batch is ready. Once a pass has handed
its last piece to the workers, the next epoch's pass starts reading (its batches enter the ring after this pass's
last one), so an epoch does not begin with a wait for its first shuffle buffer.

This module holds ``Loader``: its keywords, checked once, pick a source (``etl.loader.sources``: raw shards, a
processed output or a followed directory, each of which checks its own arguments) and an engine (the default
``etl.loader.threads``, or ``etl.loader.dali_engine``); it keeps the position and ``state_dict``. The other
modules get what they need as arguments (see ``etl.loader`` for the list).

With ``transform="device"`` the workers run only the host part of the pipeline (label check, decoding text into
keys) and the rest runs on the device right after each slot's copy, on the copy's side stream
(``etl.loader.device_stage``); the CPU then only reads and decodes. The batches are the same, bit for bit.

A batch's tensors live in a reused slot: they are valid until the next batch is requested (``.clone()`` to keep
them, or ``copy=True``: every batch then owns its tensors).
Every batch is a pure function of (files, seed, epoch, rank, world size, batch number), so ``state_dict`` is that
and resuming recomputes the order and skips ahead, re-reading at most one shuffle buffer.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from etl.errors import ConfigError
from etl.io.arrivals import check_order
from etl.io.fs import Location, location, locations
from etl.loader.batch import LoaderBatch
from etl.loader.chunk import Layout
from etl.loader.dali_engine import DaliEngine, open_dali_source
from etl.loader.device_stage import DeviceStage
from etl.loader.follow import FollowSettings
from etl.loader.order import RowGroup
from etl.loader.sequences import paddings
from etl.loader.settings import Batching, check_device, rank_and_world_size, transform_of
from etl.loader.sources import FollowedSource, Source, open_source
from etl.loader.stats import LoaderStats
from etl.loader.stream_state import Key, StreamStates
from etl.loader.threads import ThreadEngine
from etl.pipeline import Pipeline, saved_streams
from etl.runtime.allocator import tune_allocator

__all__ = ["Loader", "LoaderBatch", "LoaderStats"]

#: The engines of ``Loader(engine=...)``.
ENGINES = ("default", "dali")


class Engine(Protocol):
    """How a loader's batches are made from its source: ``etl.loader.threads.ThreadEngine`` (``"default"``: worker
    threads and a ring of slots) or ``etl.loader.dali_engine.DaliEngine`` (``"dali"``)."""

    def iterate(self, loader: Loader) -> Iterator[LoaderBatch]:
        """The rest of the loader's current epoch, from its position."""
        ...

    def set_epoch(self, loader: Loader, epoch: int) -> None:
        """The loader moves to ``epoch``: end what iterates the current one."""
        ...

    def close(self) -> None:
        """Stop every pass (and its threads)."""
        ...


class Loader(torch.utils.data.IterableDataset[LoaderBatch]):
    """Iterate over Parquet shards as transformed batches on ``device``. See the module docstring.

    A ``torch.utils.data.IterableDataset`` whose items are whole batches. ``DataLoader(loader, batch_size=None)``
    (no batching, no collate) hands each on as a plain dict of its tensors (torch's ``default_convert`` rebuilds a
    mapping as a dict: a ``LoaderBatch``'s keys and views), in the process that iterates it, where this loader's
    own ``num_workers`` threads read; iterate the loader itself to get ``LoaderBatch``es (``vocab_events``,
    ``to_kjt``). A DataLoader with worker processes (its ``num_workers > 0``) is refused (``ConfigError`` when a
    worker starts iterating): each worker would iterate a copy of the loader, repeating its rows, and the copies'
    positions would not reach this loader's ``state_dict``. Ranks of a distributed job split the rows by
    ``rank``/``world_size``, not by DataLoader worker.

    ``source``: raw shards (a directory or files; needs ``pipeline``, and ``artifacts`` unless every op is
    fit-free) or the output directory of ``etl preprocess`` (detected by its manifest.json; read as is).
    ``rank``/``world_size`` default to ``torch.distributed`` when it is initialised, else 0/1.
    ``transform`` (raw shards; the batches are the same for each): ``"host"`` (the default: worker threads run the
    whole pipeline), ``"device"`` (they run only its host part; the rest runs on ``device`` after the copy, with
    the torch backend) or ``"cudf"`` (row groups decoded by cudf straight into GPU memory, the host part run there
    too, then gathered and transformed on the device: ``etl.loader.device_columns``; needs a CUDA ``device``, cudf
    installed, local files and no list column). The older pair ``transform_on`` (``"host"``/``"device"``) and
    ``reader`` (``"cpu"``/``"cudf"``, which needs ``transform_on="device"``) still selects the same choices.
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
    ``transform="host"``; ``len()`` and ``set_epoch`` have no meaning there. Online vocabularies grow over the
    stream as over an epoch, their state saved with the position (and by ``save_vocabulary``): a restarted loader
    gives the rows not yet delivered the ids and events of an uninterrupted one.

    ``engine="dali"`` reads the npy chunks of a local processed output with NVIDIA DALI instead of worker threads
    (``etl.loader.dali_engine``; the same ``LoaderBatch`` fields, the same position and ``state_dict``).

    Sequences (the lists of a History op, ``etl.loader.sequences``): each batch gives a History op's lengths
    column as ``batch.lengths[name]`` and its lists as jagged values + offsets in ``batch.lists``; ``pad_to=L``
    also gives each of them as a padded [B, L] id tensor, ``batch.padded[column]`` (pad id 0; a history longer than
    L keeps its latest L entries), padded on ``pad_side`` (``"right"``: entries first, or ``"left"``: entries
    last); ``pad_to={"hist_len": L}`` pads the lists of the History op of that lengths column only.

    ``streams``: the loader's streaming states (online vocabularies: ``etl.loader.stream_state.StreamStates``),
    None when its pipeline keeps none."""


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
        transform: str | None = None,
        transform_on: str | None = None,
        reader: str | None = None,
        allow_partial: bool = False,
        copy: bool = False,
        storage_options: dict[str, Any] | None = None,
        follow: bool = False,
        poll_interval: float = 1.0,
        idle_flush: float | None = None,
        arrivals: str = "names",
        engine: str = "default",
        pad_to: int | Mapping[str, int] | None = None,
        pad_side: str = "right",
    ):
        tune_allocator()
        if engine not in ENGINES:
            raise ConfigError(f"engine must be 'default' or 'dali', got {engine!r}")
        dali = None
        if engine == "dali":
            dali = open_dali_source(source, pipeline, artifacts, allow_partial=allow_partial, storage_options=storage_options,
                                    transform=transform, transform_on=transform_on, reader=reader, follow=follow, arrivals=arrivals)  # fmt: skip
        if batch_size < 1 or prefetch < 1:
            raise ConfigError(f"batch_size and prefetch must be >= 1, got batch_size={batch_size}, prefetch={prefetch}")
        if num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0 (0: no worker threads), got {num_workers}")
        self.device = check_device(device)
        if dali is not None:
            self.source: Source = dali
        else:
            chosen = transform_of(transform, transform_on, reader)
            if not follow:
                _check_no_follow(arrivals)
            followed = FollowSettings.of(poll_interval, idle_flush, drop_last, arrivals) if follow else None
            items = locations(source if isinstance(source, list) else [source], storage_options)
            saved = location(artifacts, storage_options) if artifacts is not None else None
            if followed is not None:
                self.source = FollowedSource.open(items, pipeline, saved, followed, num_workers=num_workers, transform=chosen)
            else:
                self.source = open_source(items, pipeline, saved, allow_partial=allow_partial, transform=chosen, device=self.device)
        self.streams = StreamStates.of(self.pipeline.ops if self.layout.streamed else [], self.layout.stream_fields())
        if self.streams is not None and shuffle and any(s.per_epoch for s in self.streams.specs.values()):
            raise ConfigError(f"{self.streams.describe()} takes each key's rows in the loader's row order, which must be their time order: "
                              "shuffle=True permutes it; use shuffle=False (or etl preprocess, then shuffle its output)")  # fmt: skip
        # a following loader has no fixed number of rows: drop_last leaves no rank without batches
        self.rank, self.world_size = rank_and_world_size(rank, world_size, self.total_rows, batch_size, drop_last and self.source.epochs)
        if self.streams is not None and self.world_size > 1:
            raise ConfigError(f"streaming states ({self.streams.describe()}) follow one row stream: world_size must be 1, got {self.world_size}")
        self.batch_size, self.shuffle, self.seed, self.drop_last, self.copy = batch_size, shuffle, seed, drop_last, copy
        self.shuffle_buffer = max(shuffle_buffer or 4 * batch_size, 1)
        padding = paddings(self.layout.sequences, pad_to, pad_side)
        self.batching = Batching(batch_size, shuffle, seed, self.shuffle_buffer, drop_last, self.rank, self.world_size, padding)
        self.num_workers, self.prefetch = num_workers, prefetch
        self.remote = self.source.remote  # reads wait on requests: see EpochPass io_bound
        self.epoch, self.position = 0, 0
        self._finished = False  # the last pass ran to its end: the next iteration starts the epoch over
        self.stats = LoaderStats()
        self._engine: Engine = (DaliEngine(dali, threads=num_workers, prefetch=prefetch, shuffle_buffer=self.shuffle_buffer)
                                if dali is not None else ThreadEngine(self.source.reader(self.stats)))  # fmt: skip

    # ------------------------------------------------------------------ the source's
    @property
    def pipeline(self) -> Pipeline:
        """The fitted pipeline: the one that transforms the raw shards, or the one a processed output was made with."""
        return self.source.pipeline

    @property
    def layout(self) -> Layout:
        """The batches' columns (``etl.loader.chunk.Layout``)."""
        return self.source.layout

    @property
    def groups(self) -> list[RowGroup]:
        """The row groups (npy chunks) an epoch reads, in file order; none when following."""
        return self.source.groups

    @property
    def total_rows(self) -> int:
        """The rows of an epoch over every rank; 0 when following."""
        return self.source.total_rows

    @property
    def processed(self) -> bool:
        """Whether the source is the output of ``etl preprocess`` (read as is)."""
        return self.source.output is not None

    @property
    def stage(self) -> DeviceStage | None:
        """The pipeline's device part (``transform="device"`` or ``"cudf"``)."""
        return self.source.stage

    # ------------------------------------------------------------------ public
    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank). A following loader has no length (TypeError)."""
        return self.source.length(self.batching)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration yields. Setting the current epoch keeps the position, so a loop
        that resumed with ``load_state_dict`` may call it as usual. No effect on a following loader."""
        if epoch != self.epoch and self.source.epochs:
            self._engine.set_epoch(self, epoch)
            self.epoch, self.position, self._finished = epoch, 0, False

    @property
    def vocabularies(self) -> StreamStates | None:
        """Deprecated name of ``streams``, the loader's streaming states (online vocabularies) or None."""
        warnings.warn("Loader.vocabularies is deprecated: use Loader.streams", DeprecationWarning, stacklevel=2)
        return self.streams

    def state_dict(self) -> dict[str, Any]:
        """The loader's position and the settings it depends on; with streaming states (online vocabularies), their
        state at this position under ``streams``, each with the op, column and parameters that made it
        (``etl.pipeline.saved_streams``: ints, str and bytes, no pickled objects). In follow
        mode, ``follow`` (the position in the stream after the last batch handed out, see
        ``etl.loader.follow_position.FollowPosition``) and ``arrivals`` (the arrival order) replace epoch, position and
        total_rows: save it together with what the training did with that batch (a model checkpoint), never ahead of
        it, so that a restart neither loses nor repeats a row."""
        state = self._position_state()
        if self.streams is not None:
            state[saved_streams.STATE_KEY] = self.streams.to_dict(self.streams.at(self._vocab_here()))
        return state

    def _position_state(self) -> dict[str, Any]:
        """``state_dict`` without the streaming states."""
        state: dict[str, Any] = {"seed": self.seed, "rank": self.rank, "world_size": self.world_size, "batch_size": self.batch_size,
                                 "shuffle": self.shuffle, "shuffle_buffer": self.shuffle_buffer, "drop_last": self.drop_last}  # fmt: skip
        return state | self.source.position_state(self.epoch, self.position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the loader that produced ``state`` stopped (same data and settings; streaming states
        made by the same ops, columns and parameters; a state saved before states carried that record is read too). A
        state refused (``ConfigError``) leaves the position and the streaming states as they were."""
        mine = self._position_state()
        if ("follow" in state) != ("follow" in mine):
            raise ConfigError("state_dict mismatch: " + ("a following loader's state given to a loader without follow=True" if "follow" in state
                              else "the state of a loader without follow=True given to a following loader"))  # fmt: skip
        saved = {"arrivals": "names"} | state if "follow" in state else state  # a state saved before arrival orders: name order
        for k in ("seed", "rank", "world_size", "batch_size", "shuffle", "shuffle_buffer", "drop_last", "total_rows", "arrivals"):
            if k in mine and saved[k] != mine[k]:
                raise ConfigError(f"state_dict mismatch on {k}: saved {saved[k]!r}, this loader {mine[k]!r}")
        self.close()
        resume = self.source.position_from(state)  # read before anything changes: a state refused leaves the loader where it was
        if self.streams is not None:
            self.streams.load_dict(state)
        elif saved_streams.holds_states(state):
            raise ConfigError("state_dict holds streaming states (online vocabularies): this loader's pipeline keeps none")
        self.source.seek(resume)
        self.epoch, self.position, self._finished = resume.epoch, resume.position, False

    def save_vocabulary(self, directory: str | Location) -> None:
        """Write the streaming states (online vocabularies) at this position (the state ``state_dict`` holds) as
        artifacts: JSON + one Parquet table per state (``etl.pipeline.saved_streams``)."""
        if self.streams is None:
            raise ConfigError("this loader's pipeline keeps no streaming state (no online vocabulary: Categorify online: true)")
        self.streams.save(self.streams.at(self._vocab_here()), directory)

    def load_vocabulary(self, directory: str | Location) -> None:
        """Continue from the streaming states saved by ``save_vocabulary`` (the next pass starts from them): states
        made by the same ops, columns and parameters (``ArtifactError`` otherwise)."""
        if self.streams is None:
            raise ConfigError("this loader's pipeline keeps no streaming state (no online vocabulary: Categorify online: true)")
        self.close()
        self.streams.load(directory)

    def __iter__(self) -> Iterator[LoaderBatch]:
        """Yield the rest of the current epoch (all of it when the previous pass ran to its end).

        Once a pass has handed all its pieces to the workers, the next epoch's pass starts in the background (its
        batches enter the ring only after this pass's last one), so that its first batches are ready when the
        training loop calls ``set_epoch(epoch + 1)`` and iterates again (any other next pass discards it).

        ``ConfigError`` in a worker process of a ``torch.utils.data.DataLoader`` (see the class docstring)."""
        worker = torch.utils.data.get_worker_info()
        if worker is not None:
            raise ConfigError(f"a Loader does not run in a DataLoader worker process (here worker {worker.id} of {worker.num_workers}): "
                              "each would iterate a copy of it, repeating its rows in every worker, and the copies' positions would not "
                              "reach its state_dict; use DataLoader(loader, batch_size=None) with num_workers=0 (the default): "
                              f"the Loader reads with threads of its own (Loader(..., num_workers=N), here {self.num_workers})")  # fmt: skip
        return self._engine.iterate(self)

    def close(self) -> None:
        """Stop the background threads of the current iteration and of the next epoch's, if any (also done on
        break + garbage collection). With ``num_workers >= 1`` another thread may call it while the consumer waits
        for a batch (how a following loader is stopped): the consumer's loop then ends as after a last batch
        (``StopIteration``, within about 0.1 s), the position stays after the last batch handed out, and a later
        ``iter`` continues from there."""
        self._engine.close()

    # ------------------------------------------------------------------ for the engines
    def _vocab_here(self) -> Key:
        """Where the streaming states' state at the loader's position is kept (``etl.loader.stream_state``): after the
        batches handed out (``Source.vocab_key``)."""
        return self.source.vocab_key(self.batching, self.epoch, self.position)

    def _commit_vocabularies(self) -> None:
        """The next pass starts the streaming states from their state at this position."""
        if self.streams is not None:
            self.streams.commit(self._vocab_here())


def _check_no_follow(arrivals: str) -> None:
    """``ConfigError`` for an arrival order without ``follow`` (it has no meaning there)."""
    check_order(arrivals)
    if arrivals != "names":
        raise ConfigError(f"arrivals={arrivals!r} is an arrival order: it goes with follow=True")
