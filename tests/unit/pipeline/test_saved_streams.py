"""etl.pipeline.saved_streams: streaming states in a state_dict and on disk, for any state's scalars and arrays;
everything read is checked (names, the record of what made each state, scalars, dtypes, lengths, files)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import ArtifactError, ConfigError
from etl.ops.stream import StreamInput, StreamSpec
from etl.pipeline import saved_streams

#: A state that is no online vocabulary: per key a sum of floats and a count (a running mean).
SPEC = StreamSpec("y_mean", "RunningMean", "y", {"by": "k", "prior": 0.5}, "running mean", (StreamInput("k", np.dtype(np.uint64)),),
                  ("y_mean",), ("rows",), {"key": np.dtype(np.uint64), "sum": np.dtype(np.float64), "count": np.dtype(np.int64)})  # fmt: skip
SPECS = {"y_mean": SPEC}
STATE = {"y_mean": {"rows": 7, "key": np.array([3, 2**64 - 1], np.uint64), "sum": np.array([1.5, -0.25]), "count": np.array([2, 5], np.int64)}}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[n][k], b[n][k]) and np.asarray(a[n][k]).dtype == np.asarray(b[n][k]).dtype
                                        for n in a for k in a[n])  # fmt: skip


def test_a_state_round_trips_through_a_state_dict_and_a_directory(tmp_path: Path) -> None:
    doc = saved_streams.to_dict(STATE, SPECS)
    assert doc["y_mean"]["made_by"] == {"op": "RunningMean", "column": "y", "params": {"by": "k", "prior": 0.5}}
    assert isinstance(doc["y_mean"]["sum"], bytes) and doc["y_mean"]["rows"] == 7
    assert same(saved_streams.from_dict({"streams": doc}, SPECS), STATE)
    saved_streams.save(tmp_path, STATE, SPECS)
    entry = json.loads((tmp_path / "stream_state.json").read_text())["states"]["y_mean"]
    assert entry["arrays"] == {"key": "uint64", "sum": "float64", "count": "int64"} and entry["scalars"] == {"rows": 7}
    assert json.loads(pq.read_schema(tmp_path / entry["table"]).metadata[b"etl.made_by"]) == entry["made_by"] == SPEC.made_by
    state, tables = saved_streams.load(tmp_path, SPECS)
    assert same(state, STATE) and tables["y_mean"] == tmp_path / entry["table"]


def test_a_state_dict_entry_made_by_another_op_column_or_parameters_is_refused() -> None:
    doc = {"streams": saved_streams.to_dict(STATE, SPECS)}
    for mine, message in [
        (replace(SPEC, params={"by": "k", "prior": 1.0}), r"prior 0\.5 \(this pipeline: 1\.0\)"),
        (replace(SPEC, op="Other"), r"op 'RunningMean' \(this pipeline: 'Other'\)"),
        (replace(SPEC, column="z"), r"column 'y' \(this pipeline: 'z'\)"),
    ]:
        with pytest.raises(ConfigError, match=r"state_dict: running mean of 'y_mean': made by another pipeline: " + message):
            saved_streams.from_dict(doc, {"y_mean": mine})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: {k: v for k, v in d.items() if k != "made_by"}, "no valid record"),
        (lambda d: d | {"sum": d["sum"][:8]}, "differ in length"),
        (lambda d: d | {"sum": d["sum"][:5]}, "malformed arrays"),
        (lambda d: d | {"rows": True}, "scalar 'rows'"),
        (lambda d: [d], "expected a dict"),
    ],
)
def test_a_malformed_state_dict_entry_is_refused(change, message: str) -> None:
    doc = saved_streams.to_dict(STATE, SPECS)
    with pytest.raises(ConfigError, match=r"state_dict: running mean of 'y_mean': .*" + message):
        saved_streams.from_dict({"streams": {"y_mean": change(doc["y_mean"])}}, SPECS)


def test_a_state_dict_with_other_or_no_states_is_refused() -> None:
    doc = saved_streams.to_dict(STATE, SPECS)
    with pytest.raises(ConfigError, match=r"streaming states \['other'\], this loader has \['y_mean'\] \(running mean\)"):
        saved_streams.from_dict({"streams": {"other": doc["y_mean"]}}, SPECS)
    with pytest.raises(ConfigError, match="has no streams"):
        saved_streams.from_dict({"epoch": 0}, SPECS)
    assert saved_streams.holds_states({"online_vocab": {}}) and not saved_streams.holds_states({"epoch": 0})


def _rewrite(tmp_path: Path, change) -> None:
    path = tmp_path / "stream_state.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_a_directory_not_of_these_states_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no stream_state.json"):
        saved_streams.load(tmp_path, SPECS)
    saved_streams.save(tmp_path, STATE, SPECS)
    table = tmp_path / json.loads((tmp_path / "stream_state.json").read_text())["states"]["y_mean"]["table"]
    cases = [
        (lambda d: d.update(version=2), "not format 'etl-stream-state' version 1"),
        (lambda d: d["states"]["y_mean"]["made_by"]["params"].update(prior=2.0), r"prior 2\.0 \(this pipeline: 0\.5\)"),
        (lambda d: d["states"]["y_mean"]["arrays"].update(sum="float32"), "arrays .*float32"),
        (lambda d: d["states"]["y_mean"].update(table="../elsewhere.parquet"), "resolves outside"),
        (lambda d: d["states"]["y_mean"]["scalars"].pop("rows"), "scalar 'rows'"),
    ]
    for change, message in cases:
        saved_streams.save(tmp_path, STATE, SPECS)
        _rewrite(tmp_path, change)
        with pytest.raises(ArtifactError, match=r"stream_state.json.*" + message):
            saved_streams.load(tmp_path, SPECS)
    saved_streams.save(tmp_path, STATE, SPECS)
    t = pq.read_table(table)
    pq.write_table(t.set_column(1, "sum", pa.array(np.zeros(len(t), np.float32))), table)
    with pytest.raises(ArtifactError, match=f"{table}: expected columns"):
        saved_streams.load(tmp_path, SPECS)
    saved_streams.save(tmp_path, STATE, SPECS)
    pq.write_table(pq.read_table(table).replace_schema_metadata(None), table)  # the table's own record gone
    with pytest.raises(ArtifactError, match=f"{table}: table of running mean of 'y_mean': no valid record"):
        saved_streams.load(tmp_path, SPECS)


@pytest.mark.parametrize("name", ["stream_state.json", "online_vocabulary.json"])
def test_a_state_file_nested_too_deeply_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ArtifactError, match=rf"^{tmp_path / name}: cannot read: nested too deeply"):
        saved_streams.load(tmp_path, SPECS)


def test_a_table_whose_record_is_no_json_is_refused(tmp_path: Path) -> None:
    saved_streams.save(tmp_path, STATE, SPECS)
    table = tmp_path / json.loads((tmp_path / "stream_state.json").read_text())["states"]["y_mean"]["table"]
    for record in (b"[" * 100_000 + b"]" * 100_000, b"{oops"):
        pq.write_table(pq.read_table(table).replace_schema_metadata({b"etl.made_by": record}), table)
        with pytest.raises(ArtifactError, match=f"{table}: table of running mean of 'y_mean': no valid record"):
            saved_streams.load(tmp_path, SPECS)


@pytest.mark.parametrize("name", ["stream_state.json", "online_vocabulary.json"])
def test_a_table_path_leaving_the_directory_is_refused_as_such(tmp_path: Path, name: str) -> None:
    """A ``../`` table path (here to a valid table of the state beside the directory) is refused naming the file
    and the entry that hold it, in the current form and the older one."""
    d = tmp_path / "vocab"
    saved_streams.save(d, STATE, SPECS)
    (d / "online-00.parquet").rename(tmp_path / "online-00.parquet")
    if name == "stream_state.json":
        _rewrite(d, lambda doc: doc["states"]["y_mean"].update(table="../online-00.parquet"))
        field = "states.y_mean.table"
    else:
        (d / "stream_state.json").unlink()
        columns = {"y_mean": {"rows": 7, "table": "../online-00.parquet"}}
        (d / name).write_text(json.dumps({"format": "etl-online-vocabulary", "version": 1, "columns": columns}))
        field = "columns.y_mean.table"
    message = rf"^{d / name}: field '{field}': table path '\.\./online-00\.parquet' resolves outside {d}: tables must lie in the directory of {name}$"
    with pytest.raises(ArtifactError, match=message):
        saved_streams.load(d, SPECS)
