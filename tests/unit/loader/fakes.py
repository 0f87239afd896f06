"""A fake source for the loader's assembler and passes: five row groups whose rows hold their own numbers.

Every row's label, dense and sparse value is its global row number (0..319), and its list column ``g`` holds
``row % 3`` copies of it, so each batch names the rows it holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from etl.batch import Column
from etl.loader.assembler import PassSettings
from etl.loader.chunk import Chunk, Layout
from etl.loader.order import Piece, RowGroup, batches_per_rank

LAYOUT = Layout("label", ["d"], ["s"], ["g"], torch.int64)
SIZES = [70, 25, 130, 5, 90]  # rows per row group; files hold two groups each (the last one, one)
GROUPS = [RowGroup(Path(f"f{i // 2}.parquet"), i % 2, SIZES[i - 1] if i % 2 else 0, n) for i, n in enumerate(SIZES)]
FIRST = dict(zip(GROUPS, np.cumsum([0] + SIZES[:-1])))  # global number of each group's first row


def fake_read(piece: Piece) -> Chunk:
    """The piece's rows, as a reader of ``etl.loader.pieces`` would return them."""
    rows = FIRST[piece.group] + piece.start + np.arange(piece.length)
    counts = rows % 3
    lists = {"g": Column(np.repeat(rows, counts), None, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))}
    fixed = {"label": rows.astype(np.float32), "dense": rows[:, None].astype(np.float32), "sparse": rows[:, None]}
    return Chunk(len(rows), fixed, lists)


def settings(batch_size: int, shuffle_buffer: int, *, shuffle: bool, start: int = 0, rank: int = 0, world_size: int = 1,
             epoch: int = 3, seed: int = 11) -> PassSettings:  # fmt: skip
    """A whole pass (from batch ``start``) over the fake source."""
    total = batches_per_rank(sum(SIZES), world_size, batch_size, drop_last=False)
    return PassSettings(epoch=epoch, start=start, total=total, batch_size=batch_size, shuffle_buffer=shuffle_buffer,
                        shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)  # fmt: skip
