"""A loader's settings that do not depend on where its rows come from: how it batches and splits them
(``Batching``), where it transforms them (``TRANSFORMS``), and which rank it is.

``Loader`` checks each keyword once and hands these frozen objects to its source and its engine, which then need no
check of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from etl.errors import ConfigError
from etl.loader.assembler import PassSettings
from etl.loader.order import batches_per_rank
from etl.loader.sequences import Padding

#: Where a loader transforms raw shards: ``"host"`` (worker threads run the whole pipeline), ``"device"`` (they run
#: its host part, the rest runs on the device after the copy: ``etl.loader.device_stage``), ``"cudf"`` (row groups
#: are decoded by cudf into GPU memory and the whole pipeline runs there: ``etl.loader.device_columns``).
TRANSFORMS = ("host", "device", "cudf")


@dataclass(frozen=True)
class Batching:
    """How a loader cuts its rows into batches: ``batch_size`` rows each, permuted within buffers of
    ``shuffle_buffer`` rows when ``shuffle`` (drawn from ``seed``), without a short last batch with ``drop_last``;
    rank ``rank`` of ``world_size`` (``etl.loader.order``); the list columns of ``padding`` also padded
    (``etl.loader.sequences``)."""

    batch_size: int
    shuffle: bool
    seed: int
    shuffle_buffer: int
    drop_last: bool
    rank: int
    world_size: int
    padding: tuple[Padding, ...] = ()

    def length(self, total_rows: int) -> int:
        """Batches per epoch on every rank, for an epoch of ``total_rows`` rows (``etl.loader.order.batches_per_rank``)."""
        return batches_per_rank(total_rows, self.world_size, self.batch_size, self.drop_last)

    def pass_settings(self, epoch: int, start: int, total: int) -> PassSettings:
        """The settings of a pass making batches ``start`` to ``total`` of ``epoch``."""
        return PassSettings(epoch=epoch, start=start, total=total, batch_size=self.batch_size, shuffle_buffer=self.shuffle_buffer,
                            shuffle=self.shuffle, seed=self.seed, rank=self.rank, world_size=self.world_size,
                            padding=self.padding)  # fmt: skip


def transform_of(transform: str | None, transform_on: str | None, reader: str | None) -> str:
    """The ``TRANSFORMS`` choice of ``Loader(transform=...)``, or of the older pair it replaces:
    ``transform_on="host"`` → ``"host"``, ``transform_on="device"`` → ``"device"``, with ``reader="cudf"`` →
    ``"cudf"``. ``ConfigError`` (one line) for a value or pair that names no choice, or for both forms at once."""
    if transform is not None:
        if transform_on is not None or reader is not None:
            raise ConfigError(f"transform={transform!r} replaces transform_on= and reader=: give one or the other")
        if transform not in TRANSFORMS:
            raise ConfigError(f"transform must be one of {', '.join(map(repr, TRANSFORMS))}, got {transform!r}")
        return transform
    transform_on, reader = transform_on or "host", reader or "cpu"
    if transform_on not in ("host", "device"):
        raise ConfigError(f"transform_on must be 'host' or 'device', got {transform_on!r}")
    if reader not in ("cpu", "cudf"):
        raise ConfigError(f"reader must be 'cpu' or 'cudf', got {reader!r}")
    if reader == "cudf":
        if transform_on != "device":
            raise ConfigError("reader='cudf' leaves the rows in GPU memory: it needs transform_on='device'")
        return "cudf"
    return transform_on


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


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``; ``ConfigError`` for a CUDA device this torch cannot see."""
    out = torch.device(device)
    if out.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r}: torch {torch.__version__} sees no CUDA device")
    return out
