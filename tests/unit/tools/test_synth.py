"""etl.tools.synth: synthetic raw-layout shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import etl.tools.synth as synth
from etl.errors import SpecError
from etl.io.text import ROW_GROUP_ROWS, raw_arrow_schema
from etl.schema import Schema, load_schema, parse_schema
from etl.tools.synth import default_cardinalities, generate

ROOT = Path(__file__).resolve().parents[3]
ROWS = 30_000


@pytest.fixture(scope="module")
def criteo() -> Schema:
    return load_schema(ROOT / "schemas" / "criteo.yaml")


@pytest.fixture(scope="module")
def movielens() -> Schema:
    return load_schema(ROOT / "schemas" / "movielens.yaml")


@pytest.fixture(scope="module")
def criteo_run(criteo, tmp_path_factory) -> tuple[list[Path], pa.Table]:
    out = tmp_path_factory.mktemp("criteo")
    paths = generate(criteo, ROWS, 3, out, seed=7)
    return paths, pa.concat_tables([pq.read_table(p) for p in paths])


def _bytes(paths: list[Path]) -> list[bytes]:
    return [p.read_bytes() for p in paths]


def test_shapes_and_types(criteo, criteo_run, tmp_path):
    paths, t = criteo_run
    assert [p.name for p in paths] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert sorted(p.name for p in paths[0].parent.iterdir()) == [p.name for p in paths]  # no temporaries left
    assert [pq.ParquetFile(p).metadata.num_rows for p in paths] == [10_000, 10_000, 10_000]
    for p in paths:
        assert pq.read_schema(p).equals(raw_arrow_schema(criteo))
    assert t.num_rows == ROWS

    # uneven split, row groups of at most 131072 rows
    paths = generate(criteo, ROW_GROUP_ROWS + 10, 1, tmp_path / "rg")
    md = pq.ParquetFile(paths[0]).metadata
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [ROW_GROUP_ROWS, 10]
    paths = generate(criteo, 7, 3, tmp_path / "uneven")
    assert [pq.ParquetFile(p).metadata.num_rows for p in paths] == [3, 2, 2]


def test_deterministic_byte_identical(criteo, movielens, criteo_run, tmp_path, monkeypatch):
    paths, _ = criteo_run
    again = generate(criteo, ROWS, 3, tmp_path / "a", seed=7)
    assert _bytes(again) == _bytes(paths)
    monkeypatch.setattr(synth.os, "cpu_count", lambda: 1)  # one thread instead of three: same bytes
    assert _bytes(generate(criteo, ROWS, 3, tmp_path / "b", seed=7)) == _bytes(paths)
    other = generate(criteo, ROWS, 3, tmp_path / "c", seed=8)
    assert all(a != b for a, b in zip(_bytes(other), _bytes(paths)))
    ml1 = generate(movielens, 5000, 2, tmp_path / "m1", seed=3)
    ml2 = generate(movielens, 5000, 2, tmp_path / "m2", seed=3)
    assert _bytes(ml1) == _bytes(ml2)


def test_rows_do_not_depend_on_file_count(criteo, tmp_path):
    # a file's rows depend on (seed, file, row) only: file 0 of a 1-file run starts like file 0 of a 4-file run
    one = pq.read_table(generate(criteo, 400, 1, tmp_path / "one")[0])
    four = pq.read_table(generate(criteo, 400, 4, tmp_path / "four")[0])
    assert one.slice(0, 100).equals(four)


def test_hex_strings(criteo_run, tmp_path):
    _, t = criteo_run
    for i in range(1, 27):
        col = t[f"C{i}"]
        assert pc.all(pc.match_substring_regex(col, r"^[0-9a-f]{8}$")).as_py(), f"C{i}"
    s = parse_schema({"name": "w", "columns": [
        {"name": "h4", "role": "categorical", "dtype": "string", "encoding": "hex", "width": 4},
        {"name": "h13", "role": "categorical", "dtype": "string", "encoding": "hex", "width": 13},
        {"name": "h", "role": "categorical", "dtype": "string", "encoding": "hex"},
        {"name": "l", "role": "list", "dtype": "string", "encoding": "hex", "width": 3, "separator": ","},
    ]})
    w = pq.read_table(generate(s, 20_000, 1, tmp_path / "w")[0])
    assert pc.all(pc.match_substring_regex(w["h4"], r"^[0-9a-f]{4}$")).as_py()
    assert pc.all(pc.match_substring_regex(w["h13"], r"^[0-9a-f]{13}$")).as_py()
    assert pc.all(pc.match_substring_regex(w["h"], r"^[0-9a-f]{8}$")).as_py()  # no width: 8 digits
    assert pc.all(pc.match_substring_regex(pc.list_flatten(w["l"]), r"^[0-9a-f]{3}$")).as_py()
    assert default_cardinalities(s, 20_000)["h4"] <= 16**4
    # keys are scattered over the key space, not small numbers padded with zeros
    keys = np.array([int(x, 16) for x in pc.unique(t["C3"]).drop_null().to_pylist()[:2000]])
    assert keys.max() > 2**31 and (keys < 2**24).mean() < 0.05


def test_null_fractions_and_values(criteo, criteo_run):
    _, t = criteo_run
    assert t["label"].null_count == 0
    assert 0.23 < pc.mean(t["label"]).as_py() < 0.27
    assert set(pc.unique(t["label"]).to_pylist()) == {0, 1}
    cat = [t[f"C{i}"].null_count / ROWS for i in range(1, 27)]
    assert all(0.03 < f < 0.17 for f in cat) and max(cat) - min(cat) > 0.04
    dense = [t[f"I{i}"].null_count / ROWS for i in range(1, 14)]
    assert all(f < 0.5 for f in dense)
    assert sum(0.17 < f < 0.23 for f in dense) >= 3 and min(dense) == 0
    mins = [pc.min(t[f"I{i}"]).as_py() for i in range(1, 14)]
    maxs = [pc.max(t[f"I{i}"]).as_py() for i in range(1, 14)]
    assert min(mins) < 0 and min(mins) >= -3 and sum(m < 0 for m in mins) >= 3
    assert max(maxs) > 100_000  # heavy tails
    medians = [pc.approximate_median(t[f"I{i}"]).as_py() for i in range(1, 14)]
    assert max(medians) < max(maxs) / 50


def test_cardinality_skew(criteo, criteo_run):
    _, t = criteo_run
    distinct = [pc.count_distinct(t[f"C{i}"], mode="only_valid").as_py() for i in range(1, 27)]
    cards = default_cardinalities(criteo, ROWS)
    assert len(set(cards.values())) == 26 and min(cards.values()) == 10
    assert max(cards.values()) == 30 * ROWS
    assert all(d <= cards[f"C{i}"] for i, d in zip(range(1, 27), distinct))
    assert min(distinct) <= 10 and max(distinct) > 100 * min(distinct)
    assert max(distinct) > 0.3 * ROWS
    # Zipf skew: in a mid-size column the most frequent key covers far more rows than a uniform draw would
    mid = sorted(range(26), key=lambda i: distinct[i])[13]
    counts = pc.value_counts(t[f"C{mid + 1}"].drop_null()).field("counts").to_numpy()
    assert counts.max() > 20 * ROWS / distinct[mid]


def test_cardinalities_override(criteo, tmp_path):
    t = pq.read_table(generate(criteo, 5000, 1, tmp_path / "o", cardinalities={"C1": 5, "C2": 1})[0])
    assert pc.count_distinct(t["C1"], mode="only_valid").as_py() == 5
    assert pc.count_distinct(t["C2"], mode="only_valid").as_py() == 1
    with pytest.raises(SpecError, match="I1"):
        generate(criteo, 10, 1, tmp_path / "x", cardinalities={"I1": 5})
    with pytest.raises(SpecError, match="C1"):
        generate(criteo, 10, 1, tmp_path / "x", cardinalities={"C1": 2**32 + 1})
    with pytest.raises(SpecError, match="rows"):
        generate(criteo, -1, 1, tmp_path / "x")
    with pytest.raises(SpecError, match="files"):
        generate(criteo, 10, 0, tmp_path / "x")


def test_movielens_shape(movielens, tmp_path):
    seen: list[int] = []
    paths = generate(movielens, 20_000, 2, tmp_path / "ml", progress=seen.append)
    assert sum(seen) == 20_000 and all(n > 0 for n in seen)  # rows per row group written
    t = pa.concat_tables([pq.read_table(p) for p in paths])
    assert t.schema.equals(raw_arrow_schema(movielens))
    ratings = t["rating"].to_numpy()
    assert set(np.unique(ratings)) == set(np.arange(1, 11) * 0.5)
    assert 3.2 < ratings.mean() < 3.8
    users = t["userId"].drop_null().to_numpy()
    assert users.min() >= 0 and users.max() < 2**31
    assert t["genres"].null_count / 20_000 == pytest.approx(0.05, abs=0.01)  # length 0 is a null list
    lengths = pc.list_value_length(t["genres"])
    assert pc.min(lengths).as_py() == 1 and pc.max(lengths).as_py() == 6
    flat = pc.list_flatten(t["genres"])
    assert pc.all(pc.match_substring_regex(flat, r"^[a-z]{1,6}$")).as_py()
    assert pc.count_distinct(flat).as_py() <= default_cardinalities(movielens, 20_000)["genres"]


def test_empty_and_replaced_output(criteo, tmp_path):
    out = tmp_path / "out"
    generate(criteo, 100, 4, out)
    paths = generate(criteo, 0, 2, out)
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    for p in paths:
        t = pq.read_table(p)
        assert t.num_rows == 0 and t.schema.equals(raw_arrow_schema(criteo))


def test_max_cardinality_fixes_vocabulary_sizes_whatever_the_rows(criteo, tmp_path):
    small, large = default_cardinalities(criteo, 2_000, 5_000), default_cardinalities(criteo, 8_000_000, 5_000)
    assert small == large
    assert max(small[c] for c in criteo.by_role("categorical")) == 5_000
    assert min(small[c] for c in criteo.by_role("categorical")) == 10
    assert default_cardinalities(criteo, 2_000) != small  # the default follows the rows
    a = pq.read_table(generate(criteo, 4000, 1, tmp_path / "a", max_cardinality=50)[0])
    b = pq.read_table(generate(criteo, 20000, 1, tmp_path / "b", max_cardinality=50)[0])
    for c in criteo.by_role("categorical"):
        assert pc.count_distinct(b[c], mode="only_valid").as_py() <= 50
        assert pc.count_distinct(a[c], mode="only_valid").as_py() <= 50
    assert pc.count_distinct(b["C2"], mode="only_valid").as_py() >= pc.count_distinct(a["C2"], mode="only_valid").as_py()
    with pytest.raises(SpecError, match="max_cardinality"):
        generate(criteo, 10, 1, tmp_path / "x", max_cardinality=3)


def test_cli_max_cardinality(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "g"
    proc = subprocess.run([sys.executable, "-m", "etl", "generate", "--schema", str(ROOT / "schemas/criteo.yaml"), "--rows", "3000",
                           "--out", str(out), "--max-cardinality", "40"], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    t = pq.read_table(out / "part-00000.parquet")
    assert max(pc.count_distinct(t[c], mode="only_valid").as_py() for c in t.column_names if c.startswith("C")) <= 40


def test_passthrough_columns_are_row_ids_and_dropped_columns_absent(tmp_path):
    s = parse_schema({"name": "t", "columns": [
        {"name": "id", "role": "passthrough", "dtype": "string"},
        {"name": "skip", "role": "drop"},
        {"name": "y", "role": "label", "dtype": "int64"},
        {"name": "k", "role": "passthrough", "dtype": "int64"},
        {"name": "f", "role": "passthrough", "dtype": "float64"},
    ]})  # fmt: skip
    paths = generate(s, 5, 2, tmp_path / "g")
    tables = [pq.read_table(p) for p in paths]
    assert all(t.column_names == ["id", "y", "k", "f"] for t in tables)
    want = [[f * 2**32 + i for i in range(n)] for f, n in enumerate([3, 2])]
    assert [t.column("k").to_pylist() for t in tables] == want
    assert [t.column("id").to_pylist() for t in tables] == [[str(v) for v in w] for w in want]
    assert [t.column("f").to_pylist() for t in tables] == [[float(v) for v in w] for w in want]
