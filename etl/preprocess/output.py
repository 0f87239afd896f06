"""The output directory of ``etl preprocess`` across runs: what an earlier run left (``previous_run``), whether its
entry for a shard still stands for what this run would write (``is_complete``), the removal of what a rerun no longer
keeps (``remove_stale``), the fitted artifacts saved inside it (``save_artifacts``), and the rule that it lies apart
from the inputs (``check_apart``). The format itself (manifest, names) is ``etl.io.processed``'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from etl.errors import InputError, OutputError
from etl.io.files import is_shard_name, remove_temporaries, sha256_file
from etl.io.fs import Location, Url, fingerprint, is_within
from etl.io.npy import NPY_DIR, chunk_dir, chunk_file, chunk_files
from etl.io.parquet import footer_sha256
from etl.io.processed import (
    ARTIFACTS,
    ManifestEntry,
    quarantine_name,
    read_manifest,
)
from etl.pipeline import OnError, Pipeline
from etl.preprocess.shard import Formats


def previous_run(out_dir: Location) -> tuple[dict[str, ManifestEntry], Formats | None]:
    """The entries of the manifest an earlier run left in ``out_dir`` by output name, and the formats it wrote;
    none when there is no usable manifest (missing, unreadable, of another format or version, malformed)."""
    try:
        manifest = read_manifest(out_dir)
    except InputError:
        return {}, None
    return {e.output: e for e in manifest.files}, Formats("parquet" in manifest.formats, manifest.npy)


def is_complete(e: ManifestEntry, source: Location, out: Location, on_error: OnError, parquet: bool, npy: bool) -> bool:
    """Whether the earlier run's entry ``e`` stands for what this run would write to ``out`` from ``source`` as a
    Parquet file (``parquet``) and/or npy chunks (``npy``), the earlier run's formats being the same, if the fitted
    artifacts are the same too (``e.artifacts_sha256``, checked once they are saved): the same source file (path,
    size, modification time, footer checksum), unchanged since its output was written (``_changed_after``), the
    output present with its recorded checksums, and a rerun with ``on_error="raise"`` only over a shard that
    quarantined nothing (otherwise the shard is redone, and its first invalid row raises). In object storage the
    size and modification time come from the object's metadata (``etl.io.fs.fingerprint``)."""
    size, mtime_ns = fingerprint(source)
    if not (
        e.source == str(source.resolve())
        and e.source_bytes == size
        and e.source_mtime_ns == mtime_ns
        and e.source_footer_sha256 == footer_sha256(source)
        and (on_error == "quarantine" or e.rows_quarantined == 0)
    ):
        return False
    files = _output_files(e, out, parquet, npy)
    if files is None or not all(path.exists() and sha256_file(path) == digest for path, digest in files):
        return False
    return not _changed_after(source, [path for path, _ in files])


def _output_files(e: ManifestEntry, out: Location, parquet: bool, npy: bool) -> list[tuple[Location, str | None]] | None:
    """The files of ``e`` with their recorded checksums: its Parquet file ``out`` (``parquet``) and every npy chunk
    file beside it (``npy``); None when ``e`` records no npy chunks for a run that writes them."""
    files: list[tuple[Location, str | None]] = [(out, e.sha256)] if parquet else []
    if npy:
        if e.npy_chunks is None:
            return None
        for i, chunk in enumerate(e.npy_chunks):
            files.extend((out.parent / chunk_file(e.output, field, i), digest) for field, digest in chunk.sha256.items())
    return files


def _changed_after(source: Location, files: list[Location]) -> bool:
    """Whether the local file ``source`` changed after the earliest of the local ``files`` (its output) was last
    written: its status change time (``st_ctime``), which every write and every change of its modification time
    sets to the present and which cannot be set back, is later. This sees an edit in place that keeps the size, the
    footer and, set back, the modification time; a change of its metadata only (``chmod``) counts as a change too,
    which costs the shard redone. Never for an object in storage (replaced whole, with a new modification time) or
    an output there (another clock)."""
    local = [f for f in files if isinstance(f, Path)]
    if isinstance(source, Url) or not local or len(local) < len(files):
        return False
    return os.stat(source).st_ctime_ns > min(os.stat(f).st_mtime_ns for f in local)


def check_apart(out_dir: Location, inputs: list[Location]) -> None:
    """Raise OutputError when ``out_dir`` overlaps one of ``inputs`` (shards or directories of shards, symlinks
    resolved; URLs compared by prefix): equal to an input directory or to the directory of an input shard, inside
    an input directory, or containing an input. A local directory and a URL never overlap."""
    out = out_dir.resolve()
    for src in inputs:
        p = src.resolve()
        if isinstance(p, Url) != isinstance(out, Url):
            continue
        inside = is_within(out, p) if p.is_dir() else out == p.parent
        if inside or is_within(p, out):
            raise OutputError(f"{out_dir}: output directory overlaps the input {src}; choose a directory apart from the inputs")


def remove_stale(out_dir: Location, previous: dict[str, ManifestEntry], keep: set[str]) -> None:
    """Remove the files of the earlier run's entries that this run does not keep as they are: outputs it no
    longer makes (fewer shards) and outputs it redoes, with their quarantine files (a redone shard may quarantine
    nothing now), and the npy directories they leave empty. Only names this module makes (a shard name, its
    quarantine name, its chunk directory), so a tampered manifest cannot point elsewhere. Called before the new
    manifest replaces the old one, which is the proof the files are ours."""
    for e in previous.values():
        if e.output in keep or not is_shard_name(e.output):
            continue
        (out_dir / e.output).unlink(missing_ok=True)
        if e.quarantine == quarantine_name(e.output):
            (out_dir / e.quarantine).unlink(missing_ok=True)
        for name in chunk_files(e.output, len(e.npy_chunks or ())):
            (out_dir / name).unlink(missing_ok=True)
        if e.npy_chunks is not None:
            _remove_empty_dir(out_dir / chunk_dir(e.output))
    _remove_empty_dir(out_dir / NPY_DIR)


def _remove_empty_dir(directory: Location) -> None:
    """Remove ``directory`` when it is a local directory left empty (object storage has no directories)."""
    if isinstance(directory, Path) and directory.is_dir() and not directory.is_symlink() and not any(directory.iterdir()):
        directory.rmdir()


def _remove_artifact_temporaries(artifacts: Location) -> None:
    """Remove what a run killed while it saved the artifacts left under temporary names in ``artifacts`` and its
    table directories (not following symlinks)."""
    if _is_symlink(artifacts) or not artifacts.is_dir():
        return
    remove_temporaries(artifacts)
    for d in artifacts.iterdir():
        if d.is_dir() and not _is_symlink(d):
            remove_temporaries(d)


def _is_symlink(path: Location) -> bool:
    return isinstance(path, Path) and path.is_symlink()  # object storage has none


def save_artifacts(pipeline: Pipeline, out_dir: Location) -> str:
    """Save the fitted state of ``pipeline`` in ``out_dir``'s artifacts directory (removing first what a killed
    save left there); returns the checksum its manifest entries record (``artifacts_sha256``)."""
    _remove_artifact_temporaries(out_dir / ARTIFACTS)
    pipeline.save(out_dir / ARTIFACTS)
    return sha256_file(out_dir / ARTIFACTS / "pipeline.json")
