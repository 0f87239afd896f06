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
an ``InputError`` naming its file before DALI reads it. DALI reads the files itself, so the loader checks them at
its door after each read: once a window's rows are copied out of what DALI read, the files of its chunks are
checked as the default engine checks what it reads (``etl.loader.pieces.CheckedChunks``: a ``stat`` per file, the sha256 again when one
changed since), before any of its rows is handed out. A chunk replaced or rewritten under the loader (a rerun of
``etl preprocess`` into the output it reads) is an ``InputError`` naming it, never a batch of the new run's rows
or a mix; so is a chunk removed, which fails DALI's read (a failure of DALI's reader is checked the same way, over
every chunk of the pass, and is otherwise a one-line ``LoaderError``). A batch's tensors stay valid after the next batch (no
buffer is reused, so ``copy`` changes nothing); a pass's DALI pipeline, and its threads, go when the pass ends, is
replaced (``iter``, ``set_epoch``, ``load_state_dict``) or the loader is closed or dropped.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from etl.backends.rows import scatter_rows
from etl.errors import ConfigError, LoaderError
from etl.io.fs import Location, Url, location, locations
from etl.io.npy import FIELDS, NpySpec, field_file
from etl.io.processed import check_npy_layout, is_processed
from etl.loader.batch import LoaderBatch
from etl.loader.order import Piece, epoch_rng, rank_pieces
from etl.loader.pieces import CheckedChunks
from etl.loader.sources import ProcessedSource

if TYPE_CHECKING:
    from etl.loader.api import Loader

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


def open_dali_source(source: str | Location | list[str | Location], pipeline: str | Path | None, artifacts: str | Location | None, *,
                     allow_partial: bool, storage_options: dict[str, Any] | None, transform: str | None, transform_on: str | None,
                     reader: str | None, follow: bool, arrivals: str) -> ProcessedSource:  # fmt: skip
    """The source ``Loader(source, engine="dali")`` reads: a local ``etl preprocess`` output with npy chunks, which
    the loader reads as is (no transform, no follow mode, no other reader); ``ConfigError`` (one line) otherwise,
    or when DALI is not installed."""
    if reader not in (None, "cpu") or transform == "cudf" or follow or arrivals != "names":
        raise ConfigError("engine='dali' reads a finished preprocessed output with DALI's own reader: reader=, follow=True and "
                          "arrivals= do not apply")  # fmt: skip
    import_dali()
    if (transform or transform_on or "host") != "host":
        raise ConfigError("engine='dali' reads preprocessed data: transform_on must be 'host'")
    items = locations(source if isinstance(source, list) else [source], storage_options)
    if storage_options is not None or any(isinstance(p, Url) for p in items):
        raise ConfigError("engine='dali' reads a local directory: object storage is not supported")
    saved = location(artifacts) if artifacts is not None else None
    output = ProcessedSource.open(items[0], pipeline, saved, allow_partial, chunks=True) if len(items) == 1 and is_processed(items[0]) else None
    if output is None or output.output.manifest.npy is None:
        raise ConfigError(f"engine='dali' reads the npy chunks of an etl preprocess output: {source} has none "
                          "(run etl preprocess with --format npy or --format parquet,npy)")  # fmt: skip
    check_npy_layout(output.output, NpySpec.of(output.layout.fixed_columns, 1))
    return output


class DaliEngine:
    """The DALI engine (see the module docstring) over ``source``, a processed output with npy chunks
    (``open_dali_source``): ``threads`` is DALI's thread count, ``prefetch`` its queue depth, and each DALI batch a
    window of ``ceil(shuffle_buffer / chunk_rows)`` chunks. Making it checks every chunk against the manifest."""

    def __init__(self, source: ProcessedSource, *, threads: int, prefetch: int, shuffle_buffer: int):
        if source.output is None or source.output.manifest.npy is None:
            raise ValueError(f"{source.output}: the DALI engine reads the npy chunks of a processed output")
        self.dali = import_dali()
        self.source, self.output, self.spec = source, source.output, source.output.manifest.npy
        self.threads, self.prefetch = max(threads, 1), prefetch
        self.window = max(1, math.ceil(shuffle_buffer / self.spec.chunk_rows))  # chunks per DALI batch
        self._pass: _DaliPass | None = None
        self.checked = CheckedChunks(self.output)
        self._check_all(self.threads)

    def iterate(self, loader: Loader) -> _DaliPass:
        """Yield the rest of the loader's current epoch (all of it when the previous pass ran to its end)."""
        self.close()
        if loader._finished:
            loader.position, loader._finished = 0, False
        self._pass = _DaliPass(loader, self, loader.epoch, loader.position)
        return self._pass

    def set_epoch(self, loader: Loader, epoch: int) -> None:
        """The loader moves to another epoch: end the current pass."""
        self.close()

    def close(self) -> None:
        """Release the current pass's DALI pipeline."""
        if self._pass is not None:
            self._pass.close()
            self._pass = None

    def _check_all(self, threads: int) -> None:
        """Check every npy chunk of the output against its manifest sha256s, in ``threads`` threads (``InputError``
        naming the file)."""
        with ThreadPoolExecutor(threads) as pool:
            for f in [pool.submit(self.checked.check, g.path, g.index) for g in self.source.groups]:
                f.result()


class _DaliPass:
    """One pass over an epoch from batch ``start``: owns its DALI pipeline (``close`` releases it)."""

    def __init__(self, loader: Loader, engine: DaliEngine, epoch: int, start: int):
        self.loader, self.engine, self.epoch = loader, engine, epoch
        self.total = len(loader)
        b = loader.batching
        pieces = rank_pieces(engine.source.groups, seed=b.seed, epoch=epoch, shuffle=b.shuffle, rank=b.rank, world_size=b.world_size)
        k = engine.window
        self.windows = [pieces[j : j + k] for j in range(0, len(pieces), k)]
        # the window holding row start * batch_size of the rank's stream, and the rows of it already handed out
        skip = start * b.batch_size
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
        """A DALI pipeline whose readers yield the chunks of ``pieces`` in order, ``engine.window`` per batch."""
        loader, engine, dali = self.loader, self.engine, self.engine.dali
        gpu = loader.device.type == "cuda"
        device_id = (loader.device.index if loader.device.index is not None else torch.cuda.current_device()) if gpu else None
        root = str(Path(str(engine.output.directory)).resolve())
        names = [str(Path(str(p.group.path)).resolve().relative_to(root)) for p in pieces]
        pipe = dali.Pipeline(batch_size=engine.window, num_threads=engine.threads, device_id=device_id, prefetch_queue_depth=engine.prefetch)
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
        return LoaderBatch(taken["label"], taken["dense"], taken["sparse"], {}, loader.layout.sparse, dense_names=loader.layout.dense)

    def _read_window(self) -> None:
        """Read the next window from DALI: its chunks in one tensor per field, and the order its rows are handed out
        in (its pieces' rows, permuted when shuffling, less the rows a resume skips)."""
        loader, j = self.loader, self.next_window
        pieces = self.windows[j]
        outputs = self._run()
        starts = np.cumsum([0] + [p.group.num_rows for p in pieces])
        whole = {name: self._samples(tl, len(pieces), int(starts[-1])) for name, tl in zip(FIELDS, outputs)}
        for p in pieces:  # the rows copied out of what DALI read are the manifest's (a stat per file, unless one changed)
            self.engine.checked.check(p.group.path, p.group.index)
        rows = np.concatenate([np.arange(a + p.start, a + p.start + p.length) for a, p in zip(starts, pieces)])
        if loader.shuffle:
            rows = rows[epoch_rng(loader.seed, self.epoch, loader.rank, j).permutation(len(rows))]
        rows = rows[self.skip :]
        self.skip = 0
        contiguous = len(rows) == 0 or (rows[-1] - rows[0] == len(rows) - 1 and not loader.shuffle)  # a run of rows in order
        order = None if contiguous else rows
        first = int(rows[0]) if len(rows) else 0
        self.pending.append(_Window(whole, order, first, len(rows)))
        self.pending_rows += len(rows)
        self.next_window += 1
        if self.next_window >= len(self.windows):
            self.close()

    def _run(self) -> Any:
        """The next batch of the pass's DALI pipeline. When DALI's reader fails (a file it reads removed or cut
        short), the chunks of the rest of the pass are checked, so that a changed one is named; otherwise the failure
        is a ``LoaderError`` with DALI's reason on one line."""
        if self.pipe is None:
            raise RuntimeError("the pass's DALI pipeline is closed")
        try:
            return self.pipe.run()
        except RuntimeError as e:
            self.close()
            for window in self.windows[self.next_window :]:
                for p in window:
                    self.engine.checked.check(p.group.path, p.group.index)
            raise LoaderError(f"DALI's numpy reader failed: {_reason(e)}") from None

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


def _reason(error: RuntimeError) -> str:
    """DALI's reason for ``error`` on one line: the line after its "encountered:" (the first line without one)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    at = lines.index("encountered:") + 1 if "encountered:" in lines[:-1] else 0
    return lines[at] if lines else type(error).__name__


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
