"""etl.io.processed: the manifest's exact bytes, its round trip, the typed errors for a manifest that cannot be used,
and the paths ``open_processed`` gives the loader."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import InputError
from etl.io.npy import FIELDS, NpyChunk, NpySpec, chunk_file
from etl.io.processed import (
    ARTIFACTS,
    MANIFEST,
    Manifest,
    ManifestEntry,
    ProcessedOutput,
    SplitReport,
    StageRows,
    Totals,
    Unseen,
    check_npy_layout,
    committed_parts,
    describe_rows,
    is_processed,
    open_processed,
    part_path,
    quarantine_name,
    read_manifest,
    write_manifest,
)


def entry(i: int, rows_in: int, quarantined: int = 0) -> ManifestEntry:
    name = f"part-{i:05d}.parquet"
    return ManifestEntry(
        output=name,
        source=f"/data/raw/{i}.parquet",
        source_bytes=1000 + i,
        rows_in=rows_in,
        rows_out=rows_in - quarantined,
        rows_quarantined=quarantined,
        quarantine=f"quarantine/{name}" if quarantined else None,
        sha256=f"{i:064x}",
        artifacts_sha256="ab" * 32,
        source_mtime_ns=1_700_000_000_000_000_000 + i,
        source_footer_sha256="cd" * 32,
    )


MANIFEST_DOC = {
    "artifacts": "artifacts",
    "complete": False,
    "files": [
        {
            "artifacts_sha256": "ab" * 32,
            "output": "part-00000.parquet",
            "quarantine": None,
            "rows_in": 10,
            "rows_out": 10,
            "rows_quarantined": 0,
            "sha256": f"{0:064x}",
            "source": "/data/raw/0.parquet",
            "source_bytes": 1000,
            "source_footer_sha256": "cd" * 32,
            "source_mtime_ns": 1_700_000_000_000_000_000,
        },
        {
            "artifacts_sha256": "ab" * 32,
            "output": "part-00001.parquet",
            "quarantine": "quarantine/part-00001.parquet",
            "rows_in": 7,
            "rows_out": 5,
            "rows_quarantined": 2,
            "sha256": f"{1:064x}",
            "source": "/data/raw/1.parquet",
            "source_bytes": 1001,
            "source_footer_sha256": "cd" * 32,
            "source_mtime_ns": 1_700_000_000_000_000_001,
        },
    ],
    "format": "etl-manifest",
    "pipeline": "criteo",
    "totals": {"rows_in": 17, "rows_out": 15, "rows_quarantined": 2},
    "version": 1,
}


@pytest.fixture
def manifest() -> Manifest:
    return Manifest.of("criteo", [entry(0, 10), entry(1, 7, quarantined=2)], complete=False)


def write_doc(directory: Path, doc: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST).write_text(json.dumps(doc))
    return directory / MANIFEST


def test_totals_sum_the_entries(manifest: Manifest) -> None:
    assert manifest.totals == Totals(rows_in=17, rows_out=15, rows_quarantined=2)
    assert Totals.of([]) == Totals(0, 0, 0)


def test_written_bytes(tmp_path: Path, manifest: Manifest) -> None:
    write_manifest(tmp_path, manifest)
    assert (tmp_path / MANIFEST).read_bytes() == (json.dumps(MANIFEST_DOC, indent=1, sort_keys=True) + "\n").encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST]  # no temporary left


def test_round_trip(tmp_path: Path, manifest: Manifest) -> None:
    assert not is_processed(tmp_path)
    write_manifest(tmp_path, manifest)
    assert is_processed(tmp_path)
    assert read_manifest(tmp_path) == manifest
    complete = Manifest.of("criteo", manifest.files + [entry(2, 0)], complete=True)
    write_manifest(tmp_path, complete)  # replaces the previous one
    assert read_manifest(tmp_path) == complete


@pytest.mark.parametrize("key", ["artifacts_sha256", "source_mtime_ns", "source_footer_sha256"])
def test_entry_without_an_optional_field_reads_it_as_none(tmp_path: Path, key: str) -> None:
    doc = json.loads(json.dumps(MANIFEST_DOC))
    del doc["files"][0][key]
    write_doc(tmp_path, doc)
    assert read_manifest(tmp_path).files[0] == replace(entry(0, 10), **{key: None})


def test_open_processed_paths(tmp_path: Path, manifest: Manifest) -> None:
    swapped = replace(manifest, files=manifest.files[::-1], complete=True)
    for e in manifest.files:
        pq.write_table(pa.table({"x": list(range(e.rows_out))}), tmp_path / e.output)
    write_manifest(tmp_path, swapped)
    out = open_processed(tmp_path)
    assert out.directory == tmp_path
    assert out.artifacts == tmp_path / ARTIFACTS == tmp_path / "artifacts"
    assert out.parts == [tmp_path / "part-00001.parquet", tmp_path / "part-00000.parquet"]  # manifest order
    assert out.manifest == swapped


def test_committed_parts_are_the_listed_files_in_output_order_up_to_the_first_gap(tmp_path: Path) -> None:
    entries = [entry(i, 3 + i) for i in range(4)]
    for e in entries:
        pq.write_table(pa.table({"x": list(range(e.rows_out))}), tmp_path / e.output)
    listed = Manifest.of("criteo", [entries[3], entries[1], entries[0]], complete=False)  # part 2 not committed yet
    assert committed_parts(tmp_path, listed, 0) == [(tmp_path / e.output, e) for e in entries[:2]]
    assert committed_parts(tmp_path, listed, 2) == []
    assert committed_parts(tmp_path, Manifest.of("criteo", entries, complete=True), 2) == [(tmp_path / e.output, e) for e in entries[2:]]
    wrong = Manifest.of("criteo", [replace(entries[0], rows_out=9, rows_in=9)], complete=False)
    with pytest.raises(InputError, match=r'files\[0\] \("part-00000.parquet"\): the file holds 3 rows, the manifest says rows_out 9'):
        committed_parts(tmp_path, wrong, 0)
    with pytest.raises(InputError, match="listed twice"):
        committed_parts(tmp_path, Manifest.of("criteo", [entries[0], entries[0]], complete=False), 0)


def test_files_are_in_shard_index_order_past_part_99999(tmp_path: Path) -> None:
    """``Manifest.of`` orders the files by shard index, not by name (where part-100000 would come before
    part-20000); the order survives the round trip and is the order of ``open_processed``'s parts."""
    indexes = [100000, 20000, 99999, 3, 100001]
    entries = [entry(i, 2) for i in indexes]
    manifest = Manifest.of("criteo", entries, complete=True)
    assert [e.output for e in manifest.files] == [f"part-{i:05d}.parquet" for i in sorted(indexes)]
    assert [e.output for e in manifest.files][-3:] == ["part-99999.parquet", "part-100000.parquet", "part-100001.parquet"]
    for e in entries:
        pq.write_table(pa.table({"x": [1, 2]}), tmp_path / e.output)
    write_manifest(tmp_path, manifest)
    assert read_manifest(tmp_path) == manifest
    assert open_processed(tmp_path).parts == [tmp_path / f"part-{i:05d}.parquet" for i in sorted(indexes)]
    with pytest.raises(ValueError, match="not a shard name"):
        Manifest.of("criteo", [replace(entries[0], output="part-0100000.parquet")], complete=True)


def test_an_output_name_no_shard_has_is_refused(tmp_path: Path) -> None:
    """part-012345.parquet matches the shape of a shard name but is not the name of shard 12345."""
    e = replace(entry(12345, 2), output="part-012345.parquet")
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / e.output)
    write_manifest(tmp_path, replace(Manifest.of("criteo", [], complete=True), files=[e], totals=Totals.of([e])))
    with pytest.raises(InputError, match=r'files\[0\] \("part-012345.parquet"\): output is not a shard file name'):
        open_processed(tmp_path)


def test_part_and_quarantine_names(tmp_path: Path) -> None:
    assert part_path(tmp_path, 3) == tmp_path / "part-00003.parquet"
    assert quarantine_name("part-00003.parquet") == "quarantine/part-00003.parquet"


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"format": "other"}, "manifest format 'other' version 1, expected format 'etl-manifest' version 1"),
        ({"version": 2}, "manifest format 'etl-manifest' version 2"),
        ({"format": None, "version": None}, "manifest format None version None"),
    ],
)
def test_foreign_format_or_version(tmp_path: Path, change: dict, fragment: str) -> None:
    path = write_doc(tmp_path, MANIFEST_DOC | change)
    with pytest.raises(InputError) as e:
        open_processed(tmp_path)
    assert e.value.path == str(path)
    assert fragment in str(e.value)


def test_missing_or_malformed_json(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read the manifest"):
        read_manifest(tmp_path)
    path = tmp_path / MANIFEST
    for text in (b"{not json", b"", b"\xff\xfe\x00garbage", b"[" * 100_000 + b"]" * 100_000):
        path.write_bytes(text)
        with pytest.raises(InputError, match="not a JSON manifest") as e:
            read_manifest(tmp_path)
        assert e.value.path == str(path)
    path.write_text("[1, 2]")
    with pytest.raises(InputError, match="expected an object, got list"):
        read_manifest(tmp_path)


NPY = {"chunk_rows": 4, "dtypes": {"label": "<f4", "dense": "<f4", "sparse": "<i4"}, "widths": {"label": None, "dense": 2, "sparse": 3}}


def test_npy_chunks_are_checked_at_the_door(tmp_path: Path) -> None:
    """An npy-only output: the chunks' rows must add up, every file's header must match the spec; the manifest
    round-trips with its formats, spec and chunks."""
    spec = NpySpec(**NPY)
    sizes = [4, 4, 2]
    e = replace(entry(0, 10), sha256=None, npy_chunks=tuple(NpyChunk(n, {f: "0" * 64 for f in FIELDS}) for n in sizes))
    for i, n in enumerate(sizes):
        for f in FIELDS:
            path = tmp_path / chunk_file(e.output, f, i)
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, np.zeros(spec.shape(f, n), np.dtype(spec.dtypes[f])))
    manifest = Manifest.of("criteo", [e], complete=True, formats=("npy",), npy=spec)
    write_manifest(tmp_path, manifest)
    out = open_processed(tmp_path)
    assert out.manifest == manifest and out.parts == [] and out.npy_parts == [tmp_path / "npy/part-00000"]
    np.save(tmp_path / chunk_file(e.output, "sparse", 2), np.zeros((2, 4), np.int32))
    with pytest.raises(InputError, match=r"sparse-00002.npy.*expected <i4 \(2, 3\)"):
        open_processed(tmp_path)
    write_manifest(tmp_path, replace(manifest, files=[replace(e, npy_chunks=e.npy_chunks[:2])]))
    with pytest.raises(InputError, match="not chunks of 4 rows adding up to rows_out 10"):
        open_processed(tmp_path, allow_partial=True)


def test_npy_chunks_of_another_layout_than_the_pipelines_are_refused(tmp_path: Path) -> None:
    spec = NpySpec(**NPY)
    out = ProcessedOutput(tmp_path, tmp_path / ARTIFACTS, [], Manifest.of("criteo", [], complete=True, formats=("npy",), npy=spec))
    check_npy_layout(out, replace(spec, chunk_rows=99))  # chunk rows are not the layout
    with pytest.raises(InputError, match="widths"):
        check_npy_layout(out, replace(spec, widths=spec.widths | {"dense": 3}))


def _without(doc: dict, *keys: str) -> dict:
    return {k: v for k, v in doc.items() if k not in keys}


def _first_file(**change: object) -> dict:
    return MANIFEST_DOC | {"files": [MANIFEST_DOC["files"][0] | change]}


@pytest.mark.parametrize(
    "doc, fragment",
    [
        (_without(MANIFEST_DOC, "files"), "field 'files' is missing"),
        (MANIFEST_DOC | {"files": {}}, "field 'files' is {}, expected an array"),
        (MANIFEST_DOC | {"files": ["part-00000.parquet"]}, "field 'files[0]' is \"part-00000.parquet\", expected an object"),
        (MANIFEST_DOC | {"files": [_without(MANIFEST_DOC["files"][0], "output")]}, "field 'files[0].output' is missing"),
        (_first_file(rows_in="10"), "'files[0].rows_in' is \"10\", expected an integer"),
        (_first_file(rows_in=True), "'files[0].rows_in' is true, expected an integer"),
        (_first_file(quarantine=3), "'files[0].quarantine' is 3, expected a string or null"),
        (_without(MANIFEST_DOC, "totals"), "field 'totals' is missing"),
        (MANIFEST_DOC | {"totals": {"rows_in": 1, "rows_out": 1}}, "field 'totals.rows_quarantined' is missing"),
        (MANIFEST_DOC | {"complete": "yes"}, "field 'complete' is \"yes\", expected true or false"),
        (_without(MANIFEST_DOC, "pipeline"), "field 'pipeline' is missing"),
        (MANIFEST_DOC | {"formats": ["npy", "parquet"]}, "expected some of ['parquet', 'npy'] in that order"),
        (MANIFEST_DOC | {"formats": ["csv"]}, "field 'formats'"),
        (MANIFEST_DOC | {"formats": ["parquet", "npy"]}, "field 'npy' is missing"),
        (MANIFEST_DOC | {"formats": ["npy"], "npy": NPY | {"dtypes": NPY["dtypes"] | {"sparse": "<u8"}}}, "'npy.dtypes.sparse' is \"<u8\""),
        (MANIFEST_DOC | {"formats": ["npy"], "npy": NPY | {"widths": NPY["widths"] | {"label": 1}}}, "'npy.widths.label' is 1, expected null"),
        (MANIFEST_DOC | {"formats": ["npy"], "npy": NPY | {"chunk_rows": 0}}, "'npy.chunk_rows' is 0"),
        (MANIFEST_DOC | {"complete": True, "formats": ["npy"], "npy": NPY}, "npy_chunks is missing"),
        (_first_file(npy_chunks=[{"rows": 10, "sha256": {"label": "x", "dense": "y"}}]), "'files[0].npy_chunks[0].sha256.sparse' is missing"),
    ],
)
def test_malformed_manifest_names_the_file_and_field(tmp_path: Path, doc: dict, fragment: str) -> None:
    path = write_doc(tmp_path, doc)
    with pytest.raises(InputError) as e:
        open_processed(tmp_path)
    assert e.value.path == str(path)
    assert fragment in str(e.value)


# ---------------------------------------------------------------- reshaping stages


def staged_entry(i: int, rows_in: int, after: list[int], quarantined: int = 0) -> ManifestEntry:
    """An entry of a pipeline with a Filter per number in ``after`` (the rows it passes on)."""
    counts = [rows_in, *after]
    stages = tuple(StageRows("Filter", a, b) for a, b in zip(counts, counts[1:]))
    return replace(entry(i, rows_in, quarantined), rows_out=after[-1] - quarantined, stages=stages)


def test_stage_rows_round_trip_and_sum_per_stage(tmp_path: Path) -> None:
    files = [staged_entry(0, 10, [8, 5], quarantined=1), staged_entry(1, 7, [7, 2])]
    m = Manifest.of("criteo", files, complete=True)
    assert m.totals == Totals(17, 6, 1, (StageRows("Filter", 17, 15), StageRows("Filter", 15, 7)))
    assert m.totals.rows_removed == 10 == m.totals.rows_in - m.totals.rows_out - m.totals.rows_quarantined
    write_manifest(tmp_path, m)
    doc = json.loads((tmp_path / MANIFEST).read_text())
    assert doc["files"][0]["stages"] == [{"stage": "Filter", "rows_in": 10, "rows_out": 8}, {"stage": "Filter", "rows_in": 8, "rows_out": 5}]
    assert doc["totals"]["stages"][1] == {"stage": "Filter", "rows_in": 15, "rows_out": 7}
    assert read_manifest(tmp_path) == m
    for e in files:
        pq.write_table(pa.table({"x": list(range(e.rows_out))}), tmp_path / e.output)
    assert open_processed(tmp_path).manifest == m


def test_a_manifest_without_stages_has_no_stage_keys(tmp_path: Path, manifest: Manifest) -> None:
    write_manifest(tmp_path, manifest)
    assert "stages" not in (tmp_path / MANIFEST).read_text()
    assert read_manifest(tmp_path).totals.stages is None and read_manifest(tmp_path).totals.rows_removed == 0


def test_describe_rows_shows_what_the_stages_removed() -> None:
    assert describe_rows(300, 250, 0, None) == "300 in = 250 out + 0 quarantined"
    stages = (StageRows("Filter", 300_000, 260_000), StageRows("Filter", 260_000, 250_010))
    assert describe_rows(300_000, 250_000, 10, stages) == ("300,000 in = 250,000 out + 10 quarantined + 49,990 removed by stages "
                                                            "(Filter: 300,000 → 260,000, Filter: 260,000 → 250,010)")  # fmt: skip


def grouped_entry(i: int, rows_in: int, events: int, groups: int, dropped: int, quarantined: int = 0) -> ManifestEntry:
    """An entry of a pipeline with a Filter (passing on ``events``) and a Groupby writing ``groups`` groups."""
    stages = (StageRows("Filter", rows_in, events), StageRows("Groupby", events, groups + quarantined, dropped))
    return replace(entry(i, rows_in, quarantined), rows_out=groups, stages=stages)


def test_groupby_rows_round_trip_with_the_groups_dropped(tmp_path: Path) -> None:
    files = [grouped_entry(0, 10, 8, 3, 1, quarantined=2), grouped_entry(1, 7, 7, 2, 0)]
    m = Manifest.of("sessions", files, complete=True)
    assert m.totals == Totals(17, 5, 2, (StageRows("Filter", 17, 15), StageRows("Groupby", 15, 7, 1)))
    assert m.totals.rows_removed == 10 == m.totals.rows_in - m.totals.rows_out - m.totals.rows_quarantined
    write_manifest(tmp_path, m)
    doc = json.loads((tmp_path / MANIFEST).read_text())
    assert doc["files"][0]["stages"] == [{"stage": "Filter", "rows_in": 10, "rows_out": 8},
                                         {"stage": "Groupby", "rows_in": 8, "rows_out": 5, "groups_dropped": 1}]  # fmt: skip
    assert doc["totals"]["stages"][1] == {"stage": "Groupby", "rows_in": 15, "rows_out": 7, "groups_dropped": 1}
    for e in files:
        pq.write_table(pa.table({"x": list(range(e.rows_out))}), tmp_path / e.output)
    assert open_processed(tmp_path).manifest == m
    assert describe_rows(17, 5, 2, m.totals.stages) == ("17 in = 5 out + 2 quarantined + 10 removed by stages "
                                                        "(Filter: 17 → 15, Groupby: 15 events → 5 groups (1 dropped by min_len))")  # fmt: skip
    doc["files"][1]["stages"][1]["groups_dropped"] = -1
    doc["totals"]["stages"][1]["groups_dropped"] = 0  # the sum of the files'
    write_doc(tmp_path, doc)
    with pytest.raises(InputError, match=r"files\[1\] \(\"part-00001.parquet\"\): stages\[1\] \(Groupby\) dropped -1 groups, below 0"):
        open_processed(tmp_path)
    doc["files"][1]["stages"][1]["groups_dropped"] = "0"
    write_doc(tmp_path, doc)
    with pytest.raises(InputError, match="'files\\[1\\].stages\\[1\\].groups_dropped' is \"0\", expected an integer"):
        open_processed(tmp_path)


def _staged_doc(tmp_path: Path, change) -> Path:
    m = Manifest.of("criteo", [staged_entry(0, 10, [8, 5], quarantined=1)], complete=True)
    write_manifest(tmp_path, m)
    pq.write_table(pa.table({"x": list(range(4))}), tmp_path / "part-00000.parquet")
    doc = json.loads((tmp_path / MANIFEST).read_text())
    change(doc)
    if change.__name__ == "change_file":  # the totals stay the sum of the file's counts: only the file's are at fault
        doc["totals"]["stages"] = doc["files"][0]["stages"]
    return write_doc(tmp_path, doc)


def _set(path: str, value: object):
    def change(doc: dict) -> None:
        *keys, last = path.split(".")
        d = doc
        for k in keys:
            d = d[int(k)] if isinstance(d, list) else d[k]
        d[int(last) if isinstance(d, list) else last] = value

    change.__name__ = "change_file" if path.startswith("files") else "change_totals"
    return change


@pytest.mark.parametrize(
    "change, fragment",
    [
        (_set("files.0.stages.0.rows_in", 9), "stages[0] (Filter) took 9 rows in, but rows_in 10"),
        (_set("files.0.stages.1.rows_in", 7), "stages[1] (Filter) took 7 rows in, but stages[0] (Filter) passed on 8"),
        (_set("files.0.stages.1.rows_out", 6), "the 6 rows the stages passed on is not rows_out 4 + rows_quarantined 1"),
        (_set("files.0.stages.1.rows_out", "5"), "'files[0].stages[1].rows_out' is \"5\", expected an integer"),
        (_set("files.0.stages", []), "'files[0].stages' is [], expected a non-empty array"),
        (_set("files.0.stages.0", 3), "'files[0].stages[0]' is 3, expected an object"),
        (_set("totals.stages.0.rows_out", 7), "manifest totals"),
        (_set("totals.stages", None), "manifest totals"),
    ],
)
def test_stage_rows_that_do_not_add_up_are_refused(tmp_path: Path, change, fragment: str) -> None:
    path = _staged_doc(tmp_path, change)
    with pytest.raises(InputError) as e:
        open_processed(tmp_path)
    assert e.value.path == str(path) and fragment in str(e.value)


def test_files_listing_other_stages_are_refused(tmp_path: Path) -> None:
    m = Manifest.of("criteo", [staged_entry(0, 10, [8, 5])], complete=True)
    write_manifest(tmp_path, m)
    doc = json.loads((tmp_path / MANIFEST).read_text())
    doc["files"].append(MANIFEST_DOC["files"][1] | {"output": "part-00001.parquet"})
    write_doc(tmp_path, doc)
    with pytest.raises(InputError, match="the files do not all list the reshaping stages"):
        read_manifest(tmp_path)


def split_manifest(rows: int = 5) -> Manifest:
    """The manifest of the valid split of a split run: a Split stage passing on ``rows`` of 10."""
    e = replace(entry(0, 10), rows_out=rows, stages=(StageRows("Split", 10, rows),))
    report = SplitReport("valid", "60 <= ts < 80", rows, (Unseen("user", 2, 1), Unseen("tags", 3, 4)))
    return replace(Manifest.of("events", [e], complete=True), split=report)


def test_the_split_report_round_trips(tmp_path: Path) -> None:
    m = split_manifest()
    write_manifest(tmp_path, m)
    doc = json.loads((tmp_path / MANIFEST).read_text())
    assert doc["split"] == {"role": "valid", "rule": "60 <= ts < 80", "rows": 5,
                            "unseen": [{"column": "user", "rows": 2, "distinct": 1}, {"column": "tags", "rows": 3, "distinct": 4}]}  # fmt: skip
    assert read_manifest(tmp_path) == m
    write_manifest(tmp_path, replace(m, split=None))
    assert "split" not in json.loads((tmp_path / MANIFEST).read_text())


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda d: d["split"].update(role="holdout"), "'split.role' is \"holdout\", expected one of"),
        (lambda d: d["split"].update(rows=6), "'split.rows' is 6, but the Split stage of the totals passed on [5]"),
        (lambda d: d["split"].update(rows="5"), "'split.rows' is \"5\", expected an integer"),
        (lambda d: d["split"].pop("rule"), "'split.rule' is missing"),
        (lambda d: d["split"]["unseen"].append(3), "'split.unseen[2]' is 3, expected an object"),
        (lambda d: d["split"]["unseen"][0].update(rows=-1), "counts below 0"),
        (lambda d: d["split"]["unseen"][0].update(rows=9), "unseen values in more than its 5 rows"),
        (lambda d: d["totals"].pop("stages") and [f.pop("stages") for f in d["files"]], "the Split stage of the totals passed on nothing"),
    ],
)
def test_a_malformed_split_report_is_refused(tmp_path: Path, change, fragment: str) -> None:
    write_manifest(tmp_path, split_manifest())
    doc = json.loads((tmp_path / MANIFEST).read_text())
    change(doc)
    (tmp_path / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(InputError, match=re.escape(fragment)):
        read_manifest(tmp_path)
