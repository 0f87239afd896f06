"""etl.loader.chunk: the Layout of a pipeline's output, Chunk (from_table, from_batch, slice, take_lists, concat) and ChunkRun, checked against plain
Python rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from etl.io.parquet import batch_from_arrow
from etl.loader.chunk import Chunk, ChunkRun, Layout
from etl.ops.stream import Carried, StreamInput, StreamSpec
from etl.pipeline import Pipeline
from etl.schema import load_schema, parse_schema, schema_to_dict
from etl.tools.synth import generate

ROOT = Path(__file__).resolve().parents[3]
DENSE = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]


# ---------------------------------------------------------------- Layout


def _fitted(name: str, rows: int, seed: int, tmp_path_factory) -> tuple[Pipeline, list[Path]]:
    """Synthetic shards of schema ``name`` and pipeline ``name`` fitted on them."""
    paths = generate(load_schema(ROOT / f"schemas/{name}.yaml"), rows, 2, tmp_path_factory.mktemp(name), seed=seed)
    p = Pipeline.from_file(ROOT / f"pipelines/{name}.yaml")
    p.fit(paths)
    return p, paths


@pytest.fixture(scope="module")
def criteo_fitted(tmp_path_factory) -> tuple[Pipeline, list[Path]]:
    return _fitted("criteo", 4000, 3, tmp_path_factory)


@pytest.fixture(scope="module")
def movielens_fitted(tmp_path_factory) -> tuple[Pipeline, list[Path]]:
    return _fitted("movielens", 3000, 4, tmp_path_factory)


def test_layout_of_criteo(criteo_fitted) -> None:
    p, paths = criteo_fitted
    lay = Layout.of(p)
    assert lay.label == "label"
    assert lay.dense == DENSE
    assert lay.sparse == CATS
    assert lay.lists == []
    assert lay.sparse_dtype == torch.int32 and lay.sparse_numpy == np.dtype(np.int32)
    assert lay.columns == ["label", *DENSE, *CATS]

    # a transformed table becomes a chunk with the columns in layout order
    raw = pq.read_table(paths[0]).slice(100, 50)
    out = p.transform_table(raw)
    c = Chunk.from_table(out, lay)
    assert c.n == 50 and c.lists == {}
    assert c.fixed["label"].dtype == np.float32 and c.fixed["label"].shape == (50,)
    assert c.fixed["dense"].dtype == np.float32 and c.fixed["dense"].shape == (50, 13)
    assert c.fixed["sparse"].dtype == np.int32 and c.fixed["sparse"].shape == (50, 26)
    np.testing.assert_array_equal(c.fixed["label"], out.column("label").to_numpy())
    for j, name in enumerate(DENSE):
        np.testing.assert_array_equal(c.fixed["dense"][:, j], out.column(name).to_numpy(), err_msg=name)
    for j, name in enumerate(CATS):
        np.testing.assert_array_equal(c.fixed["sparse"][:, j], out.column(name).to_numpy(), err_msg=name)


def test_layout_of_movielens_has_a_list_column(movielens_fitted) -> None:
    p, paths = movielens_fitted
    lay = Layout.of(p)
    assert (lay.label, lay.dense, lay.sparse, lay.lists) == ("rating", ["timestamp"], ["userId", "movieId"], ["genres"])
    assert lay.sparse_dtype == torch.int32
    assert lay.columns == ["rating", "timestamp", "userId", "movieId", "genres"]

    out = p.transform_table(pq.read_table(paths[1]))
    c = Chunk.from_table(out, lay)
    genres = out.column("genres").to_pylist()
    g = c.lists["genres"]
    assert g.offsets.dtype == np.int64 and g.offsets[0] == 0 and len(g.offsets) == out.num_rows + 1
    assert g.values.dtype == np.int32
    assert [g.values[g.offsets[i] : g.offsets[i + 1]].tolist() for i in range(out.num_rows)] == genres
    assert any(len(x) == 0 for x in genres) and max(len(x) for x in genres) == 3  # FirstX(3); empty lists exist
    np.testing.assert_array_equal(c.fixed["sparse"][:, 0], out.column("userId").to_numpy())
    np.testing.assert_array_equal(c.fixed["sparse"][:, 1], out.column("movieId").to_numpy())


def test_layout_uses_int64_when_a_cardinality_needs_it() -> None:
    schema = load_schema(ROOT / "schemas/criteo.yaml")
    doc = {
        "name": "wide",
        "ops": [
            {"op": "Decode", "columns": "@categorical"},
            {"op": "Hash", "columns": ["C1"], "num_buckets": 2**31},
            {"op": "Hash", "columns": CATS[1:], "num_buckets": 100},
        ],
    }
    lay = Layout.of(Pipeline(doc, schema))
    assert lay.sparse_dtype == torch.int64 and lay.sparse_numpy == np.dtype(np.int64)
    doc["ops"][1]["num_buckets"] = 2**31 - 3  # cardinality 2**31 - 1 (2 reserved ids): ids fit int32
    assert Layout.of(Pipeline(doc, schema)).sparse_dtype == torch.int32


def test_layout_needs_exactly_one_label() -> None:
    d = schema_to_dict(load_schema(ROOT / "schemas/criteo.yaml"))
    for col in d["columns"]:
        if col["name"] == "label":
            col["role"] = "dense"
    schema = parse_schema(d)
    doc = {"name": "x", "ops": [{"op": "Decode", "columns": "@categorical"}, {"op": "Hash", "columns": "@categorical", "num_buckets": 10}]}
    with pytest.raises(ValueError, match="label"):
        Layout.of(Pipeline(doc, schema))


def test_layout_empty() -> None:
    lay = Layout("y", ["a", "b"], ["s"], ["L"], torch.int64)
    e = lay.empty()
    assert e.n == 0
    assert e.fixed["label"].shape == (0,) and e.fixed["dense"].shape == (0, 2) and e.fixed["sparse"].shape == (0, 1)
    assert e.fixed["sparse"].dtype == np.int64
    assert e.lists["L"].offsets.tolist() == [0] and len(e.lists["L"].values) == 0


# ---------------------------------------------------------------- Chunk against plain rows

LAYOUT = Layout("y", ["d1", "d2"], ["s1", "s2"], ["L", "M"], torch.int32)


def _rows(n: int, seed: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        lst = rng.integers(0, 100, rng.integers(0, 4)).tolist()
        lst2 = rng.integers(0, 100, rng.integers(0, 2)).tolist()
        dense = (float(rng.random()), float(rng.random()))
        sparse = (int(rng.integers(0, 1000)), int(rng.integers(0, 9)))
        rows.append((float(rng.integers(0, 2)), dense, sparse, tuple(lst), tuple(lst2)))
    return rows


def _table(rows: list[tuple]) -> pa.Table:
    f32 = np.float32
    return pa.table(
        {
            "s1": pa.array([r[2][0] for r in rows], pa.int32()),
            "y": pa.array([r[0] for r in rows], pa.float32()),
            "d2": pa.array([f32(r[1][1]) for r in rows], pa.float32()),
            "L": pa.array([list(r[3]) for r in rows], pa.list_(pa.int32())),
            "d1": pa.array([f32(r[1][0]) for r in rows], pa.float32()),
            "s2": pa.array([r[2][1] for r in rows], pa.int32()),
            "M": pa.array([list(r[4]) for r in rows], pa.list_(pa.int32())),
            "extra": pa.array([0] * len(rows), pa.int64()),  # not in the layout: ignored
        }
    )


def _as_rows(c: Chunk) -> list[tuple]:
    """A chunk back to plain rows, checking its invariants on the way."""
    assert c.fixed["label"].shape == (c.n,) and c.fixed["dense"].shape == (c.n, 2) and c.fixed["sparse"].shape == (c.n, 2)
    assert c.fixed["sparse"].dtype == np.int32 and c.fixed["dense"].dtype == np.float32
    out = []
    for k in ("L", "M"):
        col = c.lists[k]
        assert len(col.offsets) == c.n + 1 and col.offsets[0] == 0 and col.offsets[-1] == len(col.values)
        assert np.all(np.diff(col.offsets) >= 0)
    for i in range(c.n):
        lst = [tuple(c.lists[k].values[c.lists[k].offsets[i] : c.lists[k].offsets[i + 1]].tolist()) for k in ("L", "M")]
        out.append(
            (
                float(c.fixed["label"][i]),
                tuple(float(x) for x in c.fixed["dense"][i]),
                tuple(int(x) for x in c.fixed["sparse"][i]),
                *lst,
            )
        )
    return out


def _f32(rows: list[tuple]) -> list[tuple]:
    return [(r[0], tuple(float(np.float32(x)) for x in r[1]), r[2], r[3], r[4]) for r in rows]


def test_from_table_multi_chunk_and_sliced() -> None:
    rows = _f32(_rows(60, 1))
    t = pa.concat_tables([_table(rows[:25]), _table(rows[25:])])
    assert t.column("L").num_chunks == 2
    assert _as_rows(Chunk.from_table(t, LAYOUT)) == rows
    # a sliced table: list offsets do not start at 0 and values before/after the slice must not leak in
    sliced = _table(rows).slice(17, 30)
    assert sliced.column("L").chunk(0).offset == 17
    assert _as_rows(Chunk.from_table(sliced, LAYOUT)) == rows[17:47]
    assert _as_rows(Chunk.from_table(_table(rows).slice(5, 0), LAYOUT)) == []


def _take(c: Chunk, idx: np.ndarray) -> Chunk:
    """Rows ``idx`` of ``c``: fixed fields indexed here, lists by ``take_lists`` (as the loader gathers them)."""
    return Chunk(len(idx), {k: v[idx] for k, v in c.fixed.items()}, c.take_lists(idx).lists)


def test_slice_take_concat_match_plain_rows() -> None:
    rows = _f32(_rows(80, 2))
    c = Chunk.from_table(_table(rows), LAYOUT)
    for a, b in [(0, 80), (0, 0), (10, 11), (13, 57), (79, 80), (80, 80)]:
        assert _as_rows(c.slice(a, b)) == rows[a:b], (a, b)
    s = c.slice(20, 60)
    assert _as_rows(s.slice(5, 25)) == rows[25:45]  # a slice of a slice

    rng = np.random.default_rng(0)
    for idx in [np.arange(80), rng.permutation(80), np.array([5, 5, 0, 79, 3]), np.array([], np.int64)]:
        assert _as_rows(_take(c, idx)) == [rows[i] for i in idx]
    perm = rng.permutation(40)
    assert _as_rows(_take(s, perm)) == [rows[20 + i] for i in perm]  # take on a slice (offsets not from 0)

    parts = [c.slice(0, 7), c.slice(7, 7), _take(s, np.array([3, 1])), c.slice(60, 80), _take(c, np.array([0]))]
    want = rows[0:7] + [rows[23], rows[21]] + rows[60:80] + [rows[0]]
    cat = Chunk.concat(parts)
    assert cat.n == len(want)
    assert _as_rows(cat) == want
    assert cat.lists["L"].offsets.dtype == np.int64
    one = c.slice(3, 9)
    assert Chunk.concat([one]) is one
    assert _as_rows(Chunk.concat([LAYOUT.empty(), c.slice(0, 2), LAYOUT.empty()])) == rows[:2]


def _gathered(run: ChunkRun, idx: np.ndarray) -> Chunk:
    """Rows ``idx`` of a run: fixed fields by ``gather`` (into fresh arrays), lists by ``take_lists``."""
    out = {k: np.full((len(idx), *v.shape[1:]), -7, v.dtype) for k, v in run.chunks[0].fixed.items()}
    run.gather(idx, out)
    return Chunk(len(idx), out, run.lists.take_lists(idx).lists)


def test_a_chunk_run_gathers_the_rows_of_its_concatenation() -> None:
    rows = _f32(_rows(80, 4))
    c = Chunk.from_table(_table(rows), LAYOUT)
    parts = [c.slice(0, 7), c.slice(7, 7), LAYOUT.empty(), _take(c, np.array([30, 1, 2])), c.slice(60, 80), c.slice(79, 80)]
    want = rows[0:7] + [rows[30], rows[1], rows[2]] + rows[60:80] + [rows[79]]
    run = ChunkRun(parts)
    assert run.n == len(want) == 31 and run.starts.tolist() == [0, 7, 7, 7, 10, 30, 31]
    rng = np.random.default_rng(1)
    for idx in [np.arange(31), rng.permutation(31), np.array([30, 30, 0, 6, 7, 9, 10]), np.array([], np.int64)]:
        assert _as_rows(_gathered(run, idx)) == [want[i] for i in idx]
    assert np.array_equal(run.take_fixed("sparse", np.array([8, 0])), np.array([rows[1][2], rows[0][2]], np.int32))
    single = ChunkRun([c])
    assert _as_rows(_gathered(single, np.array([5, 3]))) == [rows[5], rows[3]]


def test_take_copies_and_slice_views() -> None:
    rows = _f32(_rows(20, 3))
    c = Chunk.from_table(_table(rows), LAYOUT)
    t = _take(c, np.arange(20))
    t.fixed["sparse"][:] = -1
    t.lists["L"].values[:] = -1
    assert _as_rows(c) == rows  # take does not alias the source


@pytest.mark.parametrize("which", ["criteo", "movielens"])
def test_from_batch_equals_from_table_of_the_arrow_output(which: str, criteo_fitted, movielens_fitted) -> None:
    """The loader's direct path (no Arrow) gives the same chunk as to_arrow + from_table, on a slice of a
    row group (list offsets not from 0) and with missing dense values left by the pipeline (NaN)."""
    p, paths = criteo_fitted if which == "criteo" else movielens_fitted
    raw = pq.read_table(paths[1]).slice(37, 400)
    out = p.transform(batch_from_arrow(raw, p.schema)).batch
    if which == "criteo":  # a dense value still missing after the pipeline
        out = out.with_columns({"I1": type(out["I1"])(out["I1"].values, np.arange(400) % 7 != 0)})
    lay = Layout.of(p)
    a, b = Chunk.from_batch(out, lay), Chunk.from_table(p.to_arrow(out), lay)
    assert a.n == b.n == 400
    for k in b.fixed:
        assert a.fixed[k].dtype == b.fixed[k].dtype
        np.testing.assert_array_equal(a.fixed[k], b.fixed[k], err_msg=k)
    for k in b.lists:
        np.testing.assert_array_equal(a.lists[k].values, b.lists[k].values)
        np.testing.assert_array_equal(a.lists[k].offsets, b.lists[k].offsets)
    assert list(a.lists) == lay.lists


def test_carried_columns_follow_their_rows_through_slice_concat_and_gather() -> None:
    keys, valid = np.arange(40, dtype=np.uint64) * 3, np.arange(40) % 5 != 0
    c = Chunk(40, {"label": np.zeros(40, np.float32)}, {}, {"k": Carried(keys, valid)})
    run = ChunkRun([c.slice(0, 7), c.slice(30, 40), Chunk.concat([c.slice(10, 12), c.slice(20, 21)])])
    want = [*range(7), *range(30, 40), 10, 11, 20]
    idx = np.random.default_rng(2).permutation(len(want))
    label, out = np.ones(len(idx), np.float32), Carried(np.zeros(len(idx), np.uint64), np.zeros(len(idx), np.bool_))
    run.gather(idx, {"label": label}, {"k": out})
    rows = [want[i] for i in idx]
    assert out.values.tolist() == keys[rows].tolist() and out.valid.tolist() == valid[rows].tolist() and not label.any()


def test_layout_leaves_streamed_columns_to_their_states_and_carries_their_inputs(criteo_fitted, monkeypatch) -> None:
    p, _ = criteo_fitted
    op = next(op for op in p.ops if op.name == "Categorify")

    def spec(output: str, dtype: type) -> StreamSpec:
        return StreamSpec(output, "Test", output, {}, "test state", (StreamInput("C2", np.dtype(dtype)),), (output,), ("rows",))

    monkeypatch.setattr(op, "stream_specs", lambda: [spec("C2", np.uint64), spec("I3", np.uint64)])
    lay = Layout.of(p)
    assert lay.streamed == ("C2", "I3") and lay.carried == (StreamInput("C2", np.dtype(np.uint64)),)
    assert lay.stream_fields() == {"C2": ("sparse", 1), "I3": ("dense", 2)}
    monkeypatch.setattr(op, "stream_specs", lambda: [spec("label", np.uint64)])
    with pytest.raises(ValueError, match="writes column 'label', which is no dense or single-valued sparse column"):
        Layout.of(p)
    monkeypatch.setattr(op, "stream_specs", lambda: [spec("C2", np.uint64), spec("C3", np.int64)])
    with pytest.raises(ValueError, match="read column 'C2' as uint64 and as int64"):
        Layout.of(p)
