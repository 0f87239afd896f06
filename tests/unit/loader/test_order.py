"""etl.loader.order: row groups from footers, each rank's pieces per (seed, epoch), batches per rank.

References are brute force: every (row group, row) pair is enumerated and the ranks' pieces are checked against
the contiguous-slice rule of the module docstring."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import InputError
from etl.loader.order import Piece, RowGroup, batches_per_rank, epoch_rng, rank_pieces, row_groups

# ---------------------------------------------------------------- row_groups


def _table(start: int, n: int) -> pa.Table:
    return pa.table({"x": pa.array(np.arange(start, start + n), pa.int64())})


def _write_groups(path: Path, sizes: list[int]) -> None:
    """One row group per entry of ``sizes`` (0 writes an empty row group)."""
    with pq.ParquetWriter(path, _table(0, 0).schema) as w:
        start = 0
        for n in sizes:
            w.write_table(_table(start, n), row_group_size=max(n, 1))
            start += n


def test_row_groups_skip_empty_groups_and_count_first_rows(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "c.parquet"
    _write_groups(a, [10, 0, 5, 0, 3])
    _write_groups(b, [7])
    pq.write_table(_table(0, 0), c)  # a file without rows
    md = pq.ParquetFile(a).metadata
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [10, 0, 5, 0, 3]  # the fixture is right

    got = row_groups([a, c, b])
    assert got == [
        RowGroup(a, 0, 0, 10),
        RowGroup(a, 2, 10, 5),
        RowGroup(a, 4, 15, 3),
        RowGroup(b, 0, 0, 7),
    ]
    # first_row is the file row of the group's first row: reading from there gives the group's rows
    for g in got:
        col = pq.ParquetFile(g.path).read_row_group(g.index).column("x").to_numpy()
        assert col.tolist() == list(range(g.first_row, g.first_row + g.num_rows))
    assert row_groups([]) == []


def test_row_groups_rejects_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match="bad.parquet"):
        row_groups([bad])


# ---------------------------------------------------------------- rank_pieces

SIZES = [5, 1, 13, 8, 21, 3, 2, 34, 9, 1]  # 97 rows: not divisible by 2 or 3


def _groups(sizes: list[int]) -> list[RowGroup]:
    groups, per_file = [], 4
    for i, n in enumerate(sizes):
        f, k = divmod(i, per_file)
        first = sum(sizes[f * per_file : i])
        groups.append(RowGroup(Path(f"/data/part-{f}.parquet"), k, first, n))
    return groups


def _rows(pieces: list[Piece]) -> list[tuple[Path, int, int]]:
    """(file, row group, row within the group) of every row, in stream order."""
    return [(p.group.path, p.group.index, p.start + i) for p in pieces for i in range(p.length)]


def _all_rows(groups: list[RowGroup]) -> list[tuple[Path, int, int]]:
    return [(g.path, g.index, i) for g in groups for i in range(g.num_rows)]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_are_disjoint_complete_and_balanced(world_size: int, shuffle: bool) -> None:
    groups = _groups(SIZES)
    total = sum(SIZES)
    for seed, epoch in itertools.product([0, 1, 12345], [0, 1, 2]):
        per_rank = [rank_pieces(groups, seed=seed, epoch=epoch, shuffle=shuffle, rank=r, world_size=world_size) for r in range(world_size)]
        for pieces in per_rank:
            for p in pieces:
                assert p.length > 0 and 0 <= p.start and p.start + p.length <= p.group.num_rows
        rows = [_rows(p) for p in per_rank]
        counts = [len(r) for r in rows]
        assert sum(counts) == total
        assert max(counts) - min(counts) <= 1
        # the slice rule: rank r holds rows [r*N//w, (r+1)*N//w) of the epoch's stream
        assert counts == [(r + 1) * total // world_size - r * total // world_size for r in range(world_size)]
        flat = [x for r in rows for x in r]
        assert len(set(flat)) == total  # disjoint
        assert sorted(flat) == sorted(_all_rows(groups))  # complete
        # the concatenation of the ranks is one stream: every row group whole and in order within it
        runs = [(key, [i for _, _, i in run]) for key, run in itertools.groupby(flat, key=lambda x: x[:2])]
        sizes = {(g.path, g.index): g.num_rows for g in groups}
        assert len(runs) == len(groups)  # each row group appears as one run
        assert all(rows_ == list(range(sizes[key])) for key, rows_ in runs)
        if not shuffle:
            assert flat == _all_rows(groups)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_pieces_are_deterministic_per_seed_and_epoch(world_size: int) -> None:
    groups = _groups(SIZES)

    def stream(seed: int, epoch: int, shuffle: bool = True) -> list:
        pieces = [rank_pieces(groups, seed=seed, epoch=epoch, shuffle=shuffle, rank=r, world_size=world_size) for r in range(world_size)]
        return [x for p in pieces for x in _rows(p)]

    for seed in (0, 7):
        assert stream(seed, 0) == stream(seed, 0)
        orders = [stream(seed, e) for e in range(4)]
        assert all(orders[i] != orders[j] for i in range(4) for j in range(i + 1, 4)), "epochs must reshuffle"
        assert orders[0] != _all_rows(groups)
        # without shuffle the epoch and the seed do not matter
        assert stream(seed, 0, False) == stream(seed + 1, 3, False) == _all_rows(groups)
    assert stream(0, 0) != stream(7, 0)


def test_epoch_rng_is_a_pure_function() -> None:
    a = epoch_rng(3, 1, 0, 5).permutation(100)
    assert np.array_equal(a, epoch_rng(3, 1, 0, 5).permutation(100))
    for other in [(3, 2, 0, 5), (4, 1, 0, 5), (3, 1, 1, 5), (3, 1, 0, 6)]:
        assert not np.array_equal(a, epoch_rng(*other).permutation(100)), other


def test_more_ranks_than_rows() -> None:
    groups = _groups([1, 1])
    per_rank = [rank_pieces(groups, seed=0, epoch=0, shuffle=False, rank=r, world_size=3) for r in range(3)]
    assert sorted(len(_rows(p)) for p in per_rank) == [0, 1, 1]
    assert rank_pieces([], seed=0, epoch=0, shuffle=True, rank=0, world_size=2) == []


@pytest.mark.parametrize(("rank", "world_size"), [(-1, 2), (2, 2), (5, 3), (0, 0), (0, -1)])
def test_invalid_rank_raises(rank: int, world_size: int) -> None:
    with pytest.raises(ValueError, match="rank"):
        rank_pieces(_groups(SIZES), seed=0, epoch=0, shuffle=False, rank=rank, world_size=world_size)


# ---------------------------------------------------------------- batches_per_rank


def test_batches_per_rank_matches_brute_force() -> None:
    for total, world_size, batch_size in itertools.product(range(0, 40), range(1, 5), range(1, 8)):
        rows = [(r + 1) * total // world_size - r * total // world_size for r in range(world_size)]
        keep = batches_per_rank(total, world_size, batch_size, drop_last=True)
        full = batches_per_rank(total, world_size, batch_size, drop_last=False)
        # drop_last: only full batches, and every rank can fill all of them
        assert keep == min(rows) // batch_size, (total, world_size, batch_size)
        # otherwise: enough batches for the longest rank to yield all its rows
        assert full == -(-max(rows) // batch_size), (total, world_size, batch_size)


def test_batches_per_rank_examples_and_the_empty_final_batch() -> None:
    assert batches_per_rank(10_000, 1, 1000, False) == 10
    assert batches_per_rank(10_001, 1, 1000, False) == 11
    assert batches_per_rank(10_001, 1, 1000, True) == 10
    assert batches_per_rank(20_001, 2, 777, False) == 13  # ranks of 10,000 and 10,001 rows
    assert batches_per_rank(20_001, 2, 777, True) == 12
    # 2,001 rows on 2 ranks of 1,000 and 1,001 rows: the rank with 1,000 rows owes a second (empty) batch
    assert batches_per_rank(2_001, 2, 1000, False) == 2
    assert batches_per_rank(2_001, 2, 1000, True) == 1
    assert batches_per_rank(0, 2, 1000, False) == 0
    assert batches_per_rank(3, 4, 1000, True) == 0
