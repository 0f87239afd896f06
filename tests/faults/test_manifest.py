"""A tampered or incomplete processed output is refused by ``open_processed`` (and a part whose bytes changed by
``verify_part``) with an ``InputError`` naming manifest.json and the entry; ``allow_partial`` lifts only the
complete check."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import InputError
from etl.io.files import sha256_file
from etl.io.processed import MANIFEST, Manifest, ManifestEntry, open_processed, verify_part, write_manifest

ROWS = (5, 7)


@pytest.fixture
def output(tmp_path: Path) -> Path:
    """A valid, complete processed output of two parts."""
    directory = tmp_path / "out"
    directory.mkdir()
    entries = []
    for i, rows in enumerate(ROWS):
        name = f"part-{i:05d}.parquet"
        pq.write_table(pa.table({"x": list(range(rows))}), directory / name)
        entries.append(ManifestEntry(name, f"/raw/{i}.parquet", 100, rows, rows, 0, None, sha256_file(directory / name)))
    write_manifest(directory, Manifest.of("p", entries, complete=True))
    return directory


def edit(directory: Path, change: Callable[[dict[str, Any]], None]) -> None:
    doc = json.loads((directory / MANIFEST).read_text())
    change(doc)
    (directory / MANIFEST).write_text(json.dumps(doc))


def set_totals_from_files(doc: dict[str, Any]) -> None:
    doc["totals"] = {k: sum(f[k] for f in doc["files"]) for k in ("rows_in", "rows_out", "rows_quarantined")}


def rename(name: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["files"][1]["output"] = name

    return change


def duplicate(doc: dict[str, Any]) -> None:
    doc["files"].append(doc["files"][0])
    set_totals_from_files(doc)


def totals(key: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["totals"][key] += 1

    return change


def rows_out(doc: dict[str, Any]) -> None:
    doc["files"][1]["rows_out"] += 1
    doc["files"][1]["rows_in"] += 1
    set_totals_from_files(doc)


def accounting(rows_in: int, rows_out: int, rows_quarantined: int) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["files"][1].update(rows_in=rows_in, rows_out=rows_out, rows_quarantined=rows_quarantined)
        set_totals_from_files(doc)

    return change


def quarantine(doc: dict[str, Any]) -> None:
    doc["files"][1]["quarantine"] = "../elsewhere/part-00001.parquet"


TAMPERINGS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "parent directory": (rename("../part-00001.parquet"), "not a shard file name"),
    "absolute path": (rename("/tmp/part-00001.parquet"), "not a shard file name"),
    "subdirectory": (rename("sub/part-00001.parquet"), "not a shard file name"),
    "other name": (rename("data.parquet"), "not a shard file name"),
    "missing part": (rename("part-00009.parquet"), "the file is missing"),
    "duplicate entry": (duplicate, "listed twice"),
    "totals rows_in": (totals("rows_in"), "totals .* differ"),
    "totals rows_out": (totals("rows_out"), "totals .* differ"),
    "totals rows_quarantined": (totals("rows_quarantined"), "totals .* differ"),
    "rows_out not the footer's": (rows_out, "holds 7 rows, the manifest says rows_out 8"),
    "quarantine elsewhere": (quarantine, "quarantine"),
    "rows_in not out + quarantined": (accounting(9, 7, 0), "rows_in 9 is not rows_out 7 \\+ rows_quarantined 0"),
    "negative rows_quarantined": (accounting(6, 7, -1), "rows_in 6 is not rows_out 7 \\+ rows_quarantined -1"),
}


@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_tampered_manifest_is_refused(output: Path, name: str, partial: bool) -> None:
    change, message = TAMPERINGS[name]

    def tamper(doc: dict[str, Any]) -> None:
        change(doc)
        doc["complete"] = not partial

    edit(output, tamper)
    with pytest.raises(InputError, match=f"{MANIFEST}: .*{message}") as e:
        open_processed(output, allow_partial=partial)
    assert "files[" in str(e.value) or "totals" in str(e.value)


def test_incomplete_run_is_refused_unless_partial_allowed(output: Path) -> None:
    edit(output, lambda doc: doc.update(complete=False))
    with pytest.raises(InputError, match=f"{MANIFEST}: the run is incomplete: 2 file\\(s\\) done"):
        open_processed(output)
    assert open_processed(output, allow_partial=True).parts == [output / "part-00000.parquet", output / "part-00001.parquet"]


def test_part_linked_outside_the_directory_is_refused(output: Path) -> None:
    outside = output.parent / "elsewhere.parquet"
    (output / "part-00001.parquet").rename(outside)
    (output / "part-00001.parquet").symlink_to(outside)
    with pytest.raises(InputError, match=r'files\[1\] \("part-00001.parquet"\): the file resolves to .*, outside'):
        open_processed(output)


def test_part_in_a_symlink_loop_is_refused(output: Path) -> None:
    (output / "part-00001.parquet").unlink()
    (output / "part-00001.parquet").symlink_to("part-00001.parquet")
    with pytest.raises(InputError, match=r'files\[1\] \("part-00001.parquet"\): the file cannot be resolved'):
        open_processed(output)


def test_linked_directory_and_links_inside_it_are_followed(output: Path) -> None:
    (output / "part-00001.parquet").rename(output / "kept.parquet")
    (output / "part-00001.parquet").symlink_to("kept.parquet")
    link = output.parent / "link"
    link.symlink_to(output)
    assert len(open_processed(link).parts) == 2


def test_part_not_parquet_is_refused(output: Path) -> None:
    data = (output / "part-00001.parquet").read_bytes()
    (output / "part-00001.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r'files\[1\] \("part-00001.parquet"\): not a readable Parquet file'):
        open_processed(output)


def test_verify_part_checks_the_bytes(output: Path) -> None:
    opened = open_processed(output)
    for e in opened.manifest.files:
        verify_part(opened, e)
    with open(output / "part-00001.parquet", "r+b") as f:  # same size and footer, one data byte changed
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(InputError, match=f"{MANIFEST}: file part-00001.parquet: sha256 .* differs"):
        verify_part(opened, opened.manifest.files[1])
    os.remove(output / "part-00001.parquet")
    with pytest.raises(InputError, match=f"{MANIFEST}: file part-00001.parquet: cannot read"):
        verify_part(opened, opened.manifest.files[1])


#: How a training loop reads an output in the rerun tests: (--format of etl preprocess, Loader arguments).
READERS = {
    "parquet": ([], {"num_workers": 2}),
    "npy": (["--format", "npy", "--npy-chunk-rows", 1000], {"num_workers": 2}),
    "dali": (["--format", "npy", "--npy-chunk-rows", 1000], {"engine": "dali", "shuffle_buffer": 2000}),
}


def _reader(name: str) -> tuple[list[Any], dict[str, Any]]:
    if name == "dali":
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install 'etl[dali]')")
    return READERS[name]


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_rerun_into_the_output_a_loader_reads_is_an_error_at_its_next_epoch(tmp_path: Path, reader: str) -> None:
    """A Loader reads an epoch of a processed output; ``etl preprocess`` with another pipeline then rewrites the
    output (it holds no lock the loader keeps); the loader's next epoch raises InputError naming the file, instead
    of delivering the new pipeline's ids against the old cardinalities."""
    from etl import Loader
    from tests.conftest import REPO, run_etl

    fmt, args = _reader(reader)
    raw = tmp_path / "raw"
    run_etl("generate", "--schema", REPO / "schemas/criteo.yaml", "--rows", 3000, "--files", 2, "--out", raw)
    out = tmp_path / "out"
    run_etl("preprocess", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", raw, "--out", out, *fmt)
    loader = Loader(out, batch_size=500, **args)
    first = [b.sparse.clone() for b in loader]
    assert sum(len(s) for s in first) == 3000
    run_etl("preprocess", "--pipeline", REPO / "pipelines/criteo_hash.yaml", "--input", raw, "--out", out, *fmt)
    delivered = []
    with pytest.raises(InputError, match=r"changed while this loader reads it .*sha256 \w+ differs from the manifest's"):
        for epoch in (1, 2):  # epoch 1 may have been read ahead, before the rerun: the old rows, whole
            loader.set_epoch(epoch)
            delivered += [b.sparse.clone() for b in loader]
    loader.close()
    assert len(delivered) <= len(first) and all(a.equal(b) for a, b in zip(delivered, first))  # old rows only


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_rerun_while_a_training_loop_reads_gives_whole_batches_of_one_run_or_one_line(tmp_path: Path, reader: str) -> None:
    """The must-hold of a rerun: ``etl preprocess`` with another pipeline rewrites the output while a training loop
    reads it, epoch after epoch (shuffled): every batch the loop gets is the batch the first run's files give at that
    position (a copy of them read by another loader: never a batch of the new run, nor a mix), and once the rerun
    has changed the files, the loop stops with an InputError of one line naming a file of the output."""
    import shutil
    import subprocess
    import sys

    from etl import Loader
    from tests.conftest import REPO, run_etl

    fmt, args = _reader(reader)
    raw, out, copy = tmp_path / "raw", tmp_path / "out", tmp_path / "copy"
    run_etl("generate", "--schema", REPO / "schemas/criteo.yaml", "--rows", 12000, "--files", 4, "--out", raw)
    run_etl("preprocess", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", raw, "--out", out, *fmt)
    shutil.copytree(out, copy)
    loader, reference = (Loader(d, batch_size=700, shuffle=True, seed=5, **args) for d in (out, copy))
    rerun = subprocess.Popen([sys.executable, "-m", "etl", "preprocess", "--pipeline", str(REPO / "pipelines/criteo_hash.yaml"), "--input", str(raw),
                              "--out", str(out), *map(str, fmt)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    batches = 0
    try:
        with pytest.raises(InputError) as stopped:
            for epoch in range(10_000):
                finished = rerun.poll() is not None  # then this epoch reads the new files: it must stop
                loader.set_epoch(epoch)
                reference.set_epoch(epoch)
                for got, want in zip(loader, reference):
                    assert got.label.equal(want.label) and got.dense.equal(want.dense) and got.sparse.equal(want.sparse)
                    batches += 1
                if finished:
                    break
    finally:
        _, errors = rerun.communicate(timeout=120)
        loader.close()
        reference.close()
    assert rerun.returncode == 0, errors
    message = str(stopped.value)
    assert "\n" not in message and f"{out}/" in message and "changed while this loader reads it" in message, message
