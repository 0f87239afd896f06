"""The DALI engine: ``Loader(processed_dir, engine="dali")`` reads the npy chunks of an ``etl preprocess --format
npy`` output (``etl.io.npy``) with NVIDIA DALI's numpy reader, storage → device without the loader's own threads.

On a CUDA ``device`` the reader runs on the GPU (``device="gpu"``: GPUDirect Storage where the system has it, DALI's
compatibility mode otherwise); on the CPU, DALI's CPU reader. DALI is imported when such a loader is made; without
it the loader raises ``ConfigError`` naming the extra to install.

What a rank reads, in which order, is the default engine's rule (``etl.loader.order``) applied to the chunks: the
epoch's stream of chunks (file order, or with ``shuffle`` a permutation drawn from (seed, epoch)), and rank ``r`` of
``w`` takes rows ``[r * N // w, (r + 1) * N // w)`` of it, so ranks are disjoint and complete and every rank yields
``batches_per_rank`` batches (a rank whose slice is one row shorter may end with an empty batch, as in the default
engine). DALI's own sharding (``shard_id``/``num_shards``) splits by whole files, which cannot keep that rule with
chunks of unequal rows, so each rank gives DALI the list of its own chunks (its first and last chunk may be read
whole and cut). The readers of the three fields (label, dense, sparse) get the same list, so their samples match.

Shuffling, seeded and reproducible: the chunk order above, and a shuffle window of ``ceil(shuffle_buffer /
chunk_rows)`` chunks (one DALI batch; without ``shuffle``, the same window unpermuted), whose rows are permuted
together with a generator drawn from (seed, epoch, rank, window number) before batches are cut from the stream of
windows (the remainder carries over into the next window). DALI's own ``random_shuffle`` is not used: its buffer
draws across the end of a rank's list into the next epoch, so an epoch would not hold each row exactly once.

``state_dict`` is the default engine's (epoch and batch position): each epoch's DALI pipeline is built from the
file list of that epoch, so a position fixes which window holds its next row; ``load_state_dict`` builds the
pipeline from that window's first chunk and skips the window's rows already handed out (exact skip-ahead, re-reading
at most one window). DALI's reader checkpoint would record the same reader position as an opaque blob, and the
window's permutation and carried rows would still have to be recomputed, so it is not used.

Each chunk's files are checked against the manifest's sha256s when the loader is made (a full read of the output,
in threads) and their headers (dtype, shape, size) when the output is opened, so a corrupted or truncated chunk is
an ``InputError`` naming its file before DALI reads it. A batch's tensors stay valid after the next batch (no
buffer is reused, so ``copy`` changes nothing); a pass's DALI pipeline, and its threads, go when the pass ends, is
replaced (``iter``, ``set_epoch``, ``load_state_dict``) or the loader is closed or dropped.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from etl.backends.rows import scatter_rows
from etl.errors import ConfigError
from etl.io.fs import Url, locations
from etl.io.npy import FIELDS, NpySpec, field_file
from etl.io.processed import ProcessedOutput, check_npy_layout, verify_chunk
from etl.loader.api import Loader, LoaderBatch, _open_source, rank_and_world_size
from etl.loader.chunk import Layout
from etl.loader.order import Piece, batches_per_rank, chunk_groups, epoch_rng, rank_pieces
from etl.loader.stats import LoaderStats
from etl.runtime.allocator import tune_allocator

INSTALL = "pip install 'etl[dali]'"


def import_dali() -> Any:
    """The ``nvidia.dali`` module; ``ConfigError`` naming the extra to install when it is missing."""
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn  # noqa: F401 - the readers
        import nvidia.dali.plugin.pytorch  # noqa: F401 - feed_ndarray
    except ImportError as e:
        raise ConfigError(f"engine='dali' needs NVIDIA DALI, which is not installed ({e}): {INSTALL}") from None
    return dali


class DaliLoader(Loader):
    """``Loader(source, engine="dali")``: see the module docstring. The arguments are ``Loader``'s; ``source`` must
    be a local ``etl preprocess`` output with the npy format; ``num_workers`` is DALI's thread count (at least 1),
    ``prefetch`` its queue depth; ``transform_on`` must be "host", ``storage_options`` None, ``reader`` "cpu" and
    ``follow`` False (``poll_interval`` and ``idle_flush`` are then unused)."""

    def __init__(  # noqa: PLR0913 - Loader's arguments
        self,
        source: Any,
        pipeline: Any = None,
        artifacts: Any = None,
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
        engine: str = "dali",
    ):
        if reader != "cpu" or follow or arrivals != "names":
            raise ConfigError("engine='dali' reads a finished preprocessed output with DALI's own reader: reader=, follow=True and "
                              "arrivals= do not apply")  # fmt: skip
        self._dali = import_dali()
        tune_allocator()
        if batch_size < 1 or prefetch < 1:
            raise ConfigError(f"batch_size and prefetch must be >= 1, got batch_size={batch_size}, prefetch={prefetch}")
        if transform_on != "host":
            raise ConfigError("engine='dali' reads preprocessed data: transform_on must be 'host'")
        if storage_options is not None or any(isinstance(p, Url) for p in locations(source if isinstance(source, list) else [source])):
            raise ConfigError("engine='dali' reads a local directory: object storage is not supported")
        self.pipeline, output, _ = _open_source(source, pipeline, artifacts, allow_partial, None)
        if output is None or output.manifest.npy is None:
            raise ConfigError(f"engine='dali' reads the npy chunks of an etl preprocess output: {source} has none "
                              "(run etl preprocess with --format npy or --format parquet,npy)")  # fmt: skip
        self.output, self.spec = output, output.manifest.npy
        self.processed = True
        self.layout = Layout.of(self.pipeline)
        check_npy_layout(output, NpySpec.of(self.layout.fixed_columns, 1))
        self.groups = chunk_groups(output)
        self.total_rows = sum(g.num_rows for g in self.groups)
        self.stage = None
        self._follow, self.vocabularies = None, None  # the base class's follow mode and online vocabularies do not apply
        self.rank, self.world_size = rank_and_world_size(rank, world_size, self.total_rows, batch_size, drop_last)
        self.batch_size, self.shuffle, self.seed, self.drop_last, self.copy = batch_size, shuffle, seed, drop_last, copy
        self.shuffle_buffer = max(shuffle_buffer or 4 * batch_size, 1)
        self.window = max(1, math.ceil(self.shuffle_buffer / self.spec.chunk_rows))  # chunks per DALI batch
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {device!r}: torch {torch.__version__} sees no CUDA device")
        self.num_workers, self.prefetch = max(num_workers, 1), prefetch
        self.epoch, self.position, self._finished = 0, 0, False
        self.stats = LoaderStats()
        self._pass: _DaliPass | None = None
        _verify_chunks(output, self.num_workers)

    def __len__(self) -> int:
        return batches_per_rank(self.total_rows, self.world_size, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.close()
            self.epoch, self.position, self._finished = epoch, 0, False

    def __iter__(self) -> _DaliPass:  # type: ignore[override]
        self.close()
        if self._finished:
            self.position, self._finished = 0, False
        self._pass = _DaliPass(self, self.epoch, self.position)
        return self._pass

    def close(self) -> None:
        if self._pass is not None:
            self._pass.close()
            self._pass = None


def _verify_chunks(output: ProcessedOutput, threads: int) -> None:
    """Check every npy chunk of ``output`` against its manifest sha256s (``InputError`` naming the file)."""
    jobs = [(entry, i) for entry in output.manifest.files for i in range(len(entry.npy_chunks or ()))]
    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(verify_chunk, output, entry, i) for entry, i in jobs]:
            f.result()


class _DaliPass:
    """One pass over an epoch from batch ``start``: owns its DALI pipeline (``close`` releases it)."""

    def __init__(self, loader: DaliLoader, epoch: int, start: int):
        self.loader, self.epoch = loader, epoch
        self.total = len(loader)
        pieces = rank_pieces(loader.groups, seed=loader.seed, epoch=epoch, shuffle=loader.shuffle, rank=loader.rank, world_size=loader.world_size)
        k = loader.window
        self.windows = [pieces[j : j + k] for j in range(0, len(pieces), k)]
        # the window holding row start * batch_size of the rank's stream, and the rows of it already handed out
        skip = start * loader.batch_size
        self.next_window = 0
        while self.next_window < len(self.windows) and skip >= (rows := sum(p.length for p in self.windows[self.next_window])):
            skip -= rows
            self.next_window += 1
        self.skip = skip
        self.pipe = self._build(pieces[self.next_window * k :]) if self.next_window < len(self.windows) else None
        self.pending: list[_Window] = []  # windows read whose rows are not all handed out
        self.pending_rows = 0
        self.last: float | None = None  # when the previous batch was returned (or the first next() began)

    def _build(self, pieces: list[Piece]) -> Any:
        """A DALI pipeline whose readers yield the chunks of ``pieces`` in order, ``loader.window`` per batch."""
        loader, dali = self.loader, self.loader._dali
        gpu = loader.device.type == "cuda"
        device_id = (loader.device.index if loader.device.index is not None else torch.cuda.current_device()) if gpu else None
        root = str(Path(str(loader.output.directory)).resolve())
        names = [str(Path(str(p.group.path)).resolve().relative_to(root)) for p in pieces]
        pipe = dali.Pipeline(batch_size=loader.window, num_threads=loader.num_workers, device_id=device_id, prefetch_queue_depth=loader.prefetch)
        with pipe:
            outputs = [
                dali.fn.readers.numpy(file_root=root, files=[f"{n}/{field_file(f, p.group.index)}" for n, p in zip(names, pieces)],
                                      device="gpu" if gpu else "cpu", random_shuffle=False, pad_last_batch=True, name=f)  # fmt: skip
                for f in FIELDS
            ]
            pipe.set_outputs(*outputs)
        pipe.build()
        return pipe

    def __iter__(self) -> _DaliPass:
        return self

    def __next__(self) -> LoaderBatch:
        loader = self.loader
        if loader.position >= self.total:
            self.close()
            loader._finished = True
            raise StopIteration
        bs = loader.batch_size
        t0 = time.perf_counter()
        self.last = self.last or t0
        while self.pending_rows < bs and self.pipe is not None:
            self._read_window()
        n = min(bs, self.pending_rows)
        taken = self._take(n)
        loader.position += 1
        now = time.perf_counter()
        loader.stats.add_batch(n, now - t0, now - self.last)
        self.last = now
        return LoaderBatch(taken["label"], taken["dense"], taken["sparse"], {}, loader.layout.sparse)

    def _read_window(self) -> None:
        """Read the next window from DALI: its chunks in one tensor per field, and the order its rows are handed out
        in (its pieces' rows, permuted when shuffling, less the rows a resume skips)."""
        loader, j = self.loader, self.next_window
        pieces = self.windows[j]
        if self.pipe is None:
            raise RuntimeError("the pass's DALI pipeline is closed")
        outputs = self.pipe.run()
        starts = np.cumsum([0] + [p.group.num_rows for p in pieces])
        rows = np.concatenate([np.arange(a + p.start, a + p.start + p.length) for a, p in zip(starts, pieces)])
        if loader.shuffle:
            rows = rows[epoch_rng(loader.seed, self.epoch, loader.rank, j).permutation(len(rows))]
        rows = rows[self.skip :]
        self.skip = 0
        whole = {name: self._samples(tl, len(pieces), int(starts[-1])) for name, tl in zip(FIELDS, outputs)}
        contiguous = len(rows) == 0 or (rows[-1] - rows[0] == len(rows) - 1 and not loader.shuffle)  # a run of rows in order
        order = None if contiguous else rows
        first = int(rows[0]) if len(rows) else 0
        self.pending.append(_Window(whole, order, first, len(rows)))
        self.pending_rows += len(rows)
        self.next_window += 1
        if self.next_window >= len(self.windows):
            self.close()

    def _samples(self, tl: Any, count: int, rows: int) -> torch.Tensor:
        """The first ``count`` samples of DALI's output ``tl`` (chunks of ``rows`` rows in all) as one tensor."""
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        first = tl[0]
        shape = (rows, *first.shape()[1:])
        out = torch.empty(shape, dtype=to_torch_type[first.dtype], device=self.loader.device)
        at = 0
        stream = torch.cuda.current_stream(self.loader.device) if self.loader.device.type == "cuda" else None
        for i in range(count):
            t = tl[i]
            n = t.shape()[0]
            feed_ndarray(t, out[at : at + n], cuda_stream=stream)
            at += n
        return out

    def _take(self, n: int) -> dict[str, torch.Tensor]:
        """The next ``n`` pending rows of each field (an empty batch when none is left): gathered from the window(s)
        that hold them, a view when they are one run of one window's rows."""
        if not self.pending:
            return {k: torch.from_numpy(v).to(self.loader.device) for k, v in self.loader.layout.empty().fixed.items()}
        self.pending_rows -= n
        head = self.pending[0]
        if head.left >= n:
            out = head.take(n)
        else:  # the rows of several windows, gathered into one batch
            out = {f: torch.empty((n, *t.shape[1:]), dtype=t.dtype, device=t.device) for f, t in head.fields.items()}
            at = 0
            while at < n:
                m = min(n - at, self.pending[0].left)
                self.pending[0].take_into(m, out, at)
                at += m
                if at < n:
                    self.pending.pop(0)
        if self.pending[0].left == 0:
            self.pending.pop(0)
        return out

    def close(self) -> None:
        """Release the DALI pipeline (its threads stop)."""
        pipe, self.pipe = self.pipe, None
        if pipe is not None:
            del pipe


class _Window:
    """A window read from DALI: ``fields`` hold its chunks' rows; its rows are handed out in the ``order`` of their
    numbers (None: the ``rows`` rows from ``first`` on, in order), ``n`` at a time by ``take``: gathered with the
    numba row kernel on the CPU (``etl.backends.rows``, an order of magnitude faster there than torch's
    ``index_select``), with ``index_select`` on a device."""

    def __init__(self, fields: dict[str, torch.Tensor], order: np.ndarray | None, first: int, rows: int):
        self.fields, self.order, self.first, self.rows = fields, order, first, rows
        self.device_order = None if order is None or fields["label"].device.type == "cpu" else torch.from_numpy(order).to(fields["label"].device)
        self.at = 0  # rows handed out

    @property
    def left(self) -> int:
        return self.rows - self.at

    def take(self, n: int) -> dict[str, torch.Tensor]:
        """The next ``n`` rows of each field: views when they are in order, else gathered into new tensors."""
        if self.order is None:
            a, self.at = self.at, self.at + n
            return {f: t[self.first + a : self.first + a + n] for f, t in self.fields.items()}
        out = {f: torch.empty((n, *t.shape[1:]), dtype=t.dtype, device=t.device) for f, t in self.fields.items()}
        self.take_into(n, out, 0)
        return out

    def take_into(self, n: int, out: dict[str, torch.Tensor], at: int) -> None:
        """Copy the next ``n`` rows of each field into rows ``at`` to ``at + n`` of ``out``."""
        a, self.at = self.at, self.at + n
        for f, t in self.fields.items():
            dest = out[f][at : at + n]
            if self.order is None:
                dest.copy_(t[self.first + a : self.first + a + n])
            elif self.device_order is not None:
                torch.index_select(t, 0, self.device_order[a : a + n], out=dest)
            else:
                scatter_rows(t.numpy(), self.order[a : a + n], out[f].numpy(), np.arange(at, at + n))
