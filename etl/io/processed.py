"""The processed-output format: the directory ``etl preprocess`` writes and the loader and ``etl inspect`` read.

Layout::

    part-00000.parquet ...          one processed file per input shard, named by ``etl.io.files.shard_name``
    npy/part-00000/*.npy            the same rows as fixed-width .npy chunks (``etl.io.npy``; ``--format npy``)
    quarantine/part-00000.parquet   the rejected raw rows of that shard (only when there are some)
    artifacts/                      the fitted pipeline that produced the files (see ``etl.pipeline``)
    manifest.json                   the ``Manifest``: one ``ManifestEntry`` per output file written so far

manifest.json is JSON with the keys ``format`` (``FORMAT``), ``version`` (``VERSION``), ``pipeline`` (its name),
``artifacts`` (``ARTIFACTS``), ``complete`` (every input shard has its output), ``totals`` (row counts summed over
``files``) and ``files`` (the entries, as objects with the fields of ``ManifestEntry``, in the order of their
shards' indexes, which is the order readers take them in); when the npy format was
written, also ``formats`` (the formats written, in ``FORMATS`` order; absent: Parquet only) and ``npy`` (the
``etl.io.npy.NpySpec``); when the output is one split of a split run (``etl preprocess`` with a split writes
``OUT/train``, ``OUT/valid`` and ``OUT/test``, each a processed output), also ``split`` (``SplitReport``). The
output of a shard is its Parquet file, its npy chunks, or both. It is written atomically (``write_manifest``), so
a reader sees either the previous or the new manifest, never a partial one.
The directory may be an object-storage prefix (``etl.io.fs.Url``): the manifest is then one upload, written after
the files it lists, and it is the commit record there too: readers use only the files it lists.

Reading has three levels: ``read_manifest`` parses the file and checks its format and version; ``open_processed``
also decides whether the listed files may be read as a data set (``_readable_parts``: the run is complete, the
totals add up, every entry names a distinct shard file inside the directory whose Parquet footer holds ``rows_out``
rows, and whose npy chunks, when written, add up to ``rows_out`` rows with headers of the spec's dtypes and shapes);
``verify_part`` (``verify_chunk``) checks one file's (one npy chunk's) bytes against its ``sha256``, which costs a
full read and is left to the reader to call when it reads the part; ``fetch_part`` does the same check while copying the file to a
local directory, so that a file in object storage is downloaded once for the check and the reads after it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from etl.errors import InputError
from etl.io.documents import parse_document
from etl.io.files import HashingFile, atomic_write_bytes, is_shard_name, sha256_file, shard_index, shard_name
from etl.io.fs import Location, arrow_source, is_within, open_file
from etl.io.npy import FIELDS, NpyChunk, NpySpec, check_header, chunk_dir, chunk_file

MANIFEST = "manifest.json"
FORMAT = "etl-manifest"
VERSION = 1
ARTIFACTS = "artifacts"
QUARANTINE = "quarantine"
#: The output formats ``etl preprocess`` writes, in the order they are listed.
FORMATS = ("parquet", "npy")
#: The splits of a split run (``etl.pipeline.split``), each written to the subdirectory of its name.
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class StageRows:
    """The rows one reshaping stage (``etl.pipeline.stages``) took in and passed on, for one file or summed over
    several. ``groups_dropped``: for Groupby (``etl.pipeline.groupby``), the groups ``min_len`` dropped (None,
    absent from the manifest, for other stages); its ``rows_in`` are the events, its ``rows_out`` the groups written
    plus the events quarantined (the label check and the ops run within it)."""

    stage: str
    rows_in: int
    rows_out: int
    groups_dropped: int | None = None


@dataclass(frozen=True)
class ManifestEntry:
    """One output file: ``output`` and ``quarantine`` are paths relative to the directory (``quarantine`` is None
    when no row was rejected); ``source`` is the absolute path of the input shard, ``source_bytes`` its size,
    ``source_mtime_ns`` its modification time and ``source_footer_sha256`` the checksum of its Parquet footer
    (``etl.io.parquet.footer_sha256``), all taken before it was read; ``rows_in = rows_out + rows_quarantined``
    plus the rows its pipeline's reshaping stages removed: ``stages`` lists, in pipeline order, the rows each took
    in and passed on (the first takes ``rows_in``, each takes what the one before passed on, and the last passes
    on ``rows_out + rows_quarantined``), and is None (absent from the manifest) for a pipeline without stages;
    ``sha256`` is the checksum of the output file and ``artifacts_sha256`` that of the artifacts' pipeline.json it
    was transformed with. The fields that default to None are absent from manifests written before they existed.
    ``output`` names the shard's output whatever the formats: ``sha256`` is None when its Parquet file was not
    written, ``npy_chunks`` lists its npy chunks (``etl.io.npy``) when they were (absent from the manifest
    otherwise)."""

    output: str
    source: str
    source_bytes: int
    rows_in: int
    rows_out: int
    rows_quarantined: int
    quarantine: str | None
    sha256: str | None
    artifacts_sha256: str | None = None
    source_mtime_ns: int | None = None
    source_footer_sha256: str | None = None
    npy_chunks: tuple[NpyChunk, ...] | None = None
    stages: tuple[StageRows, ...] | None = None


@dataclass(frozen=True)
class Totals:
    """Row counts summed over a manifest's entries; ``stages``: the rows of each reshaping stage, summed over the
    entries (None for a pipeline without stages)."""

    rows_in: int
    rows_out: int
    rows_quarantined: int
    stages: tuple[StageRows, ...] | None = None

    @classmethod
    def of(cls, entries: list[ManifestEntry]) -> Totals:
        """The totals of ``entries``. ValueError when they do not list the same stages (by name, in order)."""
        return cls(
            rows_in=sum(e.rows_in for e in entries),
            rows_out=sum(e.rows_out for e in entries),
            rows_quarantined=sum(e.rows_quarantined for e in entries),
            stages=sum_stages([e.stages for e in entries]),
        )

    @property
    def rows_removed(self) -> int:
        """The rows the reshaping stages removed: ``rows_in - rows_out - rows_quarantined``."""
        return sum(s.rows_in - s.rows_out for s in self.stages or ())


def sum_stages(per_file: list[tuple[StageRows, ...] | None]) -> tuple[StageRows, ...] | None:
    """The stage rows of several files summed stage by stage (None when there is no file or no stage).
    ValueError when the files do not list the same stages, by name and in order."""
    if not per_file or per_file[0] is None:
        if any(s is not None for s in per_file):
            raise ValueError("some files list reshaping stages and others none")
        return None
    names = [s.stage for s in per_file[0]]
    if any(s is None or [x.stage for x in s] != names for s in per_file):
        raise ValueError(f"the files do not all list the reshaping stages {names}")
    return tuple(StageRows(name, sum(s[k].rows_in for s in per_file if s), sum(s[k].rows_out for s in per_file if s),
                           _sum_dropped([s[k].groups_dropped for s in per_file if s]))
                 for k, name in enumerate(names))  # fmt: skip


def _sum_dropped(counts: list[int | None]) -> int | None:
    """The groups dropped over several files (None when no file counts them)."""
    known = [n for n in counts if n is not None]
    return sum(known) if known else None


def describe_stage(s: StageRows, rows_out: int) -> str:
    """One stage's rows: ``Filter: 1,000 → 900``; Groupby's ``Groupby: 1,000 events → 90 groups (5 dropped by
    min_len)``, ``rows_out``: the rows written (its groups, Groupby being the last stage)."""
    if s.groups_dropped is None:
        return f"{s.stage}: {s.rows_in:,} → {s.rows_out:,}"
    return f"{s.stage}: {s.rows_in:,} events → {rows_out:,} groups ({s.groups_dropped:,} dropped by min_len)"


def describe_rows(rows_in: int, rows_out: int, rows_quarantined: int, stages: tuple[StageRows, ...] | None) -> str:
    """The row accounting in one line: ``1,000 in = 900 out + 0 quarantined``, and with reshaping stages
    ``+ 100 removed by stages (Filter: 1,000 → 900)``."""
    line = f"{rows_in:,} in = {rows_out:,} out + {rows_quarantined:,} quarantined"
    if stages is None:
        return line
    removed = sum(s.rows_in - s.rows_out for s in stages)
    return line + f" + {removed:,} removed by stages (" + ", ".join(describe_stage(s, rows_out) for s in stages) + ")"


@dataclass(frozen=True)
class Unseen:
    """The values of an id ``column`` of a split's rows that the vocabulary fitted on the train rows lacks (they get
    its out-of-vocabulary ids): the ``rows`` holding at least one, and how many ``distinct`` values they are."""

    column: str
    rows: int
    distinct: int


@dataclass(frozen=True)
class SplitReport:
    """The split an output holds: its ``role`` (one of ``SPLITS``), the ``rule`` placing rows in it (one line), the
    ``rows`` placed in it (those its ``Split`` stage passed on: written or quarantined) and, for a valid or test
    split, the values of each Categorify column never seen in train (``unseen``, in pipeline order; empty for
    train, or a pipeline without Categorify)."""

    role: str
    rule: str
    rows: int
    unseen: tuple[Unseen, ...] = ()


@dataclass(frozen=True)
class Manifest:
    """The content of manifest.json: the name of the ``pipeline``, whether the output is ``complete``, the
    ``totals``, the ``files`` (readers take them in this order; ``of`` puts them in shard order), the ``formats``
    written and the ``npy`` spec (None unless "npy" is one of the formats); ``training``: whether the rows were
    transformed as training rows (``Pipeline.transform(..., training=True)``: out-of-fold target encodings), None
    for a pipeline whose output does not depend on it."""

    pipeline: str
    complete: bool
    totals: Totals
    files: list[ManifestEntry]
    formats: tuple[str, ...] = ("parquet",)
    npy: NpySpec | None = None
    training: bool | None = None
    split: SplitReport | None = None

    @classmethod
    def of(cls, pipeline: str, files: list[ManifestEntry], complete: bool, formats: tuple[str, ...] = ("parquet",),
           npy: NpySpec | None = None, training: bool | None = None) -> Manifest:  # fmt: skip
        """A manifest of ``files`` with their totals, the files in the order of their shards' indexes
        (``etl.io.files.shard_index``: ``part-99999.parquet`` before ``part-100000.parquet``). ValueError when an
        output is not a shard name."""
        ordered = sorted(files, key=lambda e: shard_index(e.output))
        return cls(pipeline=pipeline, complete=complete, totals=Totals.of(ordered), files=ordered, formats=formats, npy=npy, training=training)


@dataclass(frozen=True)
class ProcessedOutput:
    """A processed output opened for reading: its ``directory``, its ``artifacts`` directory, its Parquet output
    files (``parts``, in manifest order; empty when none was written), the directories of its npy chunks
    (``npy_parts``, in manifest order; empty when none were written) and its ``manifest``."""

    directory: Location
    artifacts: Location
    parts: list[Location]
    manifest: Manifest
    npy_parts: list[Location] = field(default_factory=list)


def part_path(directory: Location, index: int) -> Location:
    """Where the output of the ``index``-th input shard goes."""
    return directory / shard_name(index)


def quarantine_name(output: str) -> str:
    """The quarantine file of the output file named ``output``, relative to the directory (as the manifest
    records it)."""
    return f"{QUARANTINE}/{output}"


def is_processed(directory: Location) -> bool:
    """Whether ``directory`` holds a processed output (it has a manifest.json)."""
    return (directory / MANIFEST).is_file()


def write_manifest(directory: Location, manifest: Manifest) -> None:
    """Write ``manifest`` as ``directory``/manifest.json, atomically. A Parquet-only manifest has neither
    ``formats`` nor ``npy`` keys, and its entries no ``npy_chunks``: the manifest of earlier versions; nor has one
    whose ``training`` is None a ``training`` key."""
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "pipeline": manifest.pipeline,
        "artifacts": ARTIFACTS,
        "complete": manifest.complete,
        "totals": _stages_without_none(_without_none(asdict(manifest.totals), ("stages",))),
        "files": [_stages_without_none(_without_none(asdict(e), ("npy_chunks", "stages"))) for e in manifest.files],
    }
    if manifest.formats != ("parquet",):
        doc["formats"] = list(manifest.formats)
    if manifest.npy is not None:
        doc["npy"] = asdict(manifest.npy)
    if manifest.training is not None:
        doc["training"] = manifest.training
    if manifest.split is not None:
        doc["split"] = asdict(manifest.split)
    atomic_write_bytes(directory / MANIFEST, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def _without_none(doc: dict[str, Any], optional: tuple[str, ...]) -> dict[str, Any]:
    """``doc`` without the ``optional`` keys whose value is None (the manifest of earlier versions lacks them)."""
    return {k: v for k, v in doc.items() if k not in optional or v is not None}


def _stages_without_none(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (an entry or the totals) with its stages' ``groups_dropped`` left out where None."""
    if doc.get("stages") is not None:
        doc["stages"] = [_without_none(s, ("groups_dropped",)) for s in doc["stages"]]
    return doc


def read_manifest(directory: Location) -> Manifest:
    """The manifest of ``directory``. Raises ``InputError`` naming manifest.json when it is missing or
    unreadable, not JSON, of another format or version, lacks a field (or has one of the wrong type), or when its
    files do not list the same reshaping stages."""
    path = directory / MANIFEST
    try:
        doc = parse_document(path.read_bytes())
    except OSError as e:
        raise InputError(str(path), f"cannot read the manifest: {e.strerror or e}") from None
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError, nested too deeply
        raise InputError(str(path), f"not a JSON manifest: {e}") from None
    if not isinstance(doc, dict):
        raise InputError(str(path), f"not a JSON manifest: expected an object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        found = f"format {doc.get('format')!r} version {doc.get('version')!r}"
        raise InputError(str(path), f"manifest {found}, expected format {FORMAT!r} version {VERSION}")
    totals = _field(doc, "totals", dict, path)
    files = _field(doc, "files", list, path)
    formats = _formats(doc, path)
    entries = [_entry(e, path, f"files[{i}]") for i, e in enumerate(files)]
    try:
        sum_stages([e.stages for e in entries])
    except ValueError as e:
        raise InputError(str(path), f"manifest field 'files': {e}") from None
    counts = {k: _field(totals, k, int, path, "totals") for k in ("rows_in", "rows_out", "rows_quarantined")}
    stages = _stage_rows(totals, path, "totals")
    return Manifest(
        pipeline=_field(doc, "pipeline", str, path),
        complete=_field(doc, "complete", bool, path),
        totals=Totals(**counts, stages=stages),
        files=entries,
        formats=formats,
        npy=_npy_spec(_field(doc, "npy", dict, path), path) if "npy" in formats else None,
        training=_field(doc, "training", bool, path) if "training" in doc else None,
        split=_split_report(_field(doc, "split", dict, path), stages, path) if "split" in doc else None,
    )


def open_processed(directory: Location, *, allow_partial: bool = False) -> ProcessedOutput:
    """Open the processed output in ``directory`` for reading. Raises ``InputError`` naming manifest.json as
    ``read_manifest`` does, when the run is incomplete (unless ``allow_partial``: then the files written so far are
    the parts), when the totals differ from the sum of the entries, or when an entry cannot be read as a part of the
    data set (see ``_readable_parts``)."""
    manifest = read_manifest(directory)
    path = directory / MANIFEST
    if not manifest.complete and not allow_partial:
        raise InputError(
            str(path),
            f"the run is incomplete: {len(manifest.files)} file(s) done, and the output of other input shards is missing; "
            "rerun etl preprocess with the same --out to finish it",
        )
    summed = Totals.of(manifest.files)
    if manifest.totals != summed:
        raise InputError(str(path), f"manifest totals {asdict(manifest.totals)} differ from the sum of its files {asdict(summed)}")
    parts = _readable_parts(directory, manifest)
    npy_parts = [directory / chunk_dir(e.output) for e in manifest.files] if manifest.npy is not None else []
    return ProcessedOutput(
        directory=directory, artifacts=directory / ARTIFACTS, parts=parts if "parquet" in manifest.formats else [], manifest=manifest,
        npy_parts=npy_parts,
    )  # fmt: skip


def verify_part(output: ProcessedOutput, entry: ManifestEntry) -> None:
    """Check that the file of ``entry`` (one of ``output.manifest.files``) holds the bytes its manifest entry
    records: raises ``InputError`` naming manifest.json and the file when its sha256 differs or it cannot be read."""
    try:
        digest = sha256_file(output.directory / entry.output)
    except OSError as e:
        raise _unreadable(output, entry, e) from None
    _check_digest(output, entry, digest)


def verify_chunk(output: ProcessedOutput, entry: ManifestEntry, index: int) -> None:
    """Check that the files of npy chunk ``index`` of ``entry`` hold the bytes the manifest records: raises
    ``InputError`` naming manifest.json and the file when a sha256 differs or a file cannot be read."""
    chunk = _chunks(entry)[index]
    for kind in FIELDS:
        name = chunk_file(entry.output, kind, index)
        try:
            digest = sha256_file(output.directory / name)
        except OSError as e:
            raise InputError(str(output.directory / MANIFEST), f"file {name}: cannot read: {e.strerror or e}") from None
        if digest != chunk.sha256[kind]:
            raise InputError(str(output.directory / MANIFEST), f"file {name}: sha256 {digest} differs from the manifest's {chunk.sha256[kind]}")


def _chunks(entry: ManifestEntry) -> tuple[NpyChunk, ...]:
    if entry.npy_chunks is None:
        raise ValueError(f"{entry.output}: the manifest lists no npy chunks")
    return entry.npy_chunks


def fetch_part(output: ProcessedOutput, entry: ManifestEntry, directory: Path) -> Path:
    """The file of ``entry`` copied into the local ``directory`` in one read, its sha256 computed from the bytes
    as they are written, and returned once it is the manifest's: the check of ``verify_part``, and for a file in
    object storage the one download that serves both the check and every read after it. Raises ``InputError``
    as ``verify_part`` does, leaving no copy behind."""
    copy = directory / entry.output
    try:
        with open_file(output.directory / entry.output) as source, HashingFile(copy) as sink:
            shutil.copyfileobj(source, sink, _COPY_CHUNK)
        _check_digest(output, entry, sink.hexdigest())
    except OSError as e:
        copy.unlink(missing_ok=True)
        raise _unreadable(output, entry, e) from None
    except InputError:
        copy.unlink(missing_ok=True)
        raise
    return copy


#: Bytes per read when ``fetch_part`` copies a file.
_COPY_CHUNK = 1 << 20


def _check_digest(output: ProcessedOutput, entry: ManifestEntry, digest: str) -> None:
    if digest != entry.sha256:
        raise InputError(
            str(output.directory / MANIFEST), f"file {entry.output}: sha256 {digest} differs from the manifest's {entry.sha256}"
        )


def _unreadable(output: ProcessedOutput, entry: ManifestEntry, e: OSError) -> InputError:
    return InputError(str(output.directory / MANIFEST), f"file {entry.output}: cannot read: {e.strerror or e}")


def _readable_parts(directory: Location, manifest: Manifest) -> list[Location]:
    """The output files of ``manifest``, in its order: the one place where a processed output is checked before
    its files are read as a data set. Each entry must name a shard file (``etl.io.files.is_shard_name``) that no
    other entry names, and pass ``_readable_part``."""
    path = directory / MANIFEST
    root = directory.resolve()
    seen: set[str] = set()
    parts = []
    for i, e in enumerate(manifest.files):
        if e.output in seen:
            raise InputError(str(path), f"files[{i}] ({json.dumps(e.output)}): the file is listed twice")
        seen.add(e.output)
        parts.append(_readable_part(directory, root, manifest, i, e))
    return parts


def committed_parts(directory: Location, manifest: Manifest, start: int) -> list[tuple[Location, ManifestEntry]]:
    """The Parquet files ``start``, ``start + 1``, ... of the output in ``directory`` whose ``manifest`` (read
    now) lists them, in output order (file ``i`` is the output of the ``i``-th input shard, ``part_path``), up to
    the first one it does not list yet (a following run, ``etl.preprocess.follow``, may commit a file before the
    one ahead of it), each with its entry, checked as ``open_processed`` checks the files it reads. ``InputError``
    naming manifest.json for an output without Parquet files, a file listed twice, or an entry that fails a check."""
    path = directory / MANIFEST
    if "parquet" not in manifest.formats:
        raise InputError(str(path), f"the output has no Parquet files (formats {', '.join(manifest.formats)})")
    listed = {e.output: (i, e) for i, e in enumerate(manifest.files)}
    if len(listed) != len(manifest.files):
        raise InputError(str(path), "a file is listed twice")
    root = directory.resolve()
    out: list[tuple[Location, ManifestEntry]] = []
    while (name := shard_name(start + len(out))) in listed:
        i, e = listed[name]
        out.append((_readable_part(directory, root, manifest, i, e), e))
    return out


def _readable_part(directory: Location, root: Location, manifest: Manifest, i: int, e: ManifestEntry) -> Location:
    """The file of entry ``e`` (``files[i]`` of ``manifest``), checked: it must be a shard file name, resolve
    (following symlinks) to a file inside ``directory`` (``root``: resolved), whose Parquet footer holds
    ``rows_out`` rows, and whose quarantine file, if any, is the one ``quarantine_name`` gives."""
    path = directory / MANIFEST
    where = f"files[{i}] ({json.dumps(e.output)})"
    if not is_shard_name(e.output):
        raise InputError(str(path), f"{where}: output is not a shard file name such as {shard_name(0)}")
    if e.quarantine is not None and e.quarantine != quarantine_name(e.output):
        raise InputError(str(path), f"{where}: quarantine {json.dumps(e.quarantine)}, expected {quarantine_name(e.output)!r}")
    _check_rows(e, path, where)
    part = directory / e.output
    try:
        resolved = part.resolve()
    except (OSError, RuntimeError) as err:  # a symlink loop
        raise InputError(str(path), f"{where}: the file cannot be resolved: {err}") from None
    if not is_within(resolved, root):
        raise InputError(str(path), f"{where}: the file resolves to {resolved}, outside {root}")
    if "parquet" in manifest.formats:
        if e.sha256 is None:
            raise InputError(str(path), f"{where}: sha256 is null, but the Parquet file is one of the formats")
        rows = _footer_rows(part, path, where)
        if rows != e.rows_out:
            raise InputError(str(path), f"{where}: the file holds {rows} rows, the manifest says rows_out {e.rows_out}")
    if manifest.npy is not None:
        _check_chunks(directory, manifest.npy, e, where)
    return part


def _check_rows(e: ManifestEntry, path: Location, where: str) -> None:
    """``InputError`` unless the row counts of ``e`` are >= 0 and add up: ``rows_in = rows_out + rows_quarantined``
    without stages; with stages, the first takes ``rows_in``, each the rows the one before passed on, and the last
    passes on ``rows_out + rows_quarantined``."""
    stages = e.stages or ()
    counts = (e.rows_in, e.rows_out, e.rows_quarantined, *(n for s in stages for n in (s.rows_in, s.rows_out)))
    rows = e.rows_in
    for k, s in enumerate(stages):
        if s.groups_dropped is not None and s.groups_dropped < 0:
            raise InputError(str(path), f"{where}: stages[{k}] ({s.stage}) dropped {s.groups_dropped} groups, below 0")
        if s.rows_in != rows:
            took = "rows_in" if k == 0 else f"stages[{k - 1}] ({stages[k - 1].stage}) passed on"
            raise InputError(str(path), f"{where}: stages[{k}] ({s.stage}) took {s.rows_in} rows in, but {took} {rows}")
        rows = s.rows_out
    if min(counts) < 0 or rows != e.rows_out + e.rows_quarantined:
        what = f"rows_in {e.rows_in}" if not stages else f"the {rows} rows the stages passed on"
        raise InputError(str(path), f"{where}: {what} is not rows_out {e.rows_out} + rows_quarantined {e.rows_quarantined}")


def _check_chunks(directory: Location, spec: NpySpec, e: ManifestEntry, where: str) -> None:
    """Check the npy chunks of entry ``e``: listed, every one but the last of ``spec.chunk_rows`` rows, adding up
    to ``rows_out``, and each file's header of its field's dtype and shape, its size matching (``check_header``)."""
    path = directory / MANIFEST
    if e.npy_chunks is None:
        raise InputError(str(path), f"{where}: npy_chunks is missing, but npy is one of the formats")
    sizes = [c.rows for c in e.npy_chunks]
    if any(n != spec.chunk_rows for n in sizes[:-1]) or (sizes and not 0 < sizes[-1] <= spec.chunk_rows) or sum(sizes) != e.rows_out:
        expected = f"chunks of {spec.chunk_rows} rows adding up to rows_out {e.rows_out}"
        raise InputError(str(path), f"{where}: npy chunks of {sizes} rows are not {expected}")
    root = directory.resolve()
    for i, chunk in enumerate(e.npy_chunks):
        for kind in FIELDS:
            file = directory / chunk_file(e.output, kind, i)
            if not is_within(file.resolve(), root):
                raise InputError(str(path), f"{where}: the file {chunk_file(e.output, kind, i)} resolves outside {root}")
            check_header(file, spec, kind, chunk.rows)


def _footer_rows(part: Location, path: Location, where: str) -> int:
    """The row count in the Parquet footer of ``part``."""
    source, filesystem = arrow_source(part)
    try:
        return int(pq.read_metadata(source, filesystem=filesystem).num_rows)
    except FileNotFoundError:
        raise InputError(str(path), f"{where}: the file is missing") from None
    except (OSError, pa.ArrowException) as e:
        raise InputError(str(path), f"{where}: not a readable Parquet file: {e}") from None


_ENTRY_TYPES: dict[str, type | tuple[type, ...]] = {
    "output": str,
    "source": str,
    "source_bytes": int,
    "rows_in": int,
    "rows_out": int,
    "rows_quarantined": int,
    "quarantine": (str, type(None)),
    "sha256": (str, type(None)),
    "artifacts_sha256": (str, type(None)),
    "source_mtime_ns": (int, type(None)),
    "source_footer_sha256": (str, type(None)),
    "npy_chunks": (list, type(None)),
    "stages": (list, type(None)),
}
_ENTRY_OPTIONAL = ("artifacts_sha256", "source_mtime_ns", "source_footer_sha256", "npy_chunks", "stages")


def _entry(doc: Any, path: Location, where: str) -> ManifestEntry:
    if not isinstance(doc, dict):
        raise InputError(str(path), f"manifest field '{where}' is {json.dumps(doc)}, expected an object")
    present = [k for k in _ENTRY_TYPES if k in doc or k not in _ENTRY_OPTIONAL]
    fields = {k: _field(doc, k, _ENTRY_TYPES[k], path, where) for k in present}
    if fields.get("npy_chunks") is not None:
        fields["npy_chunks"] = tuple(_chunk(c, path, f"{where}.npy_chunks[{i}]") for i, c in enumerate(fields["npy_chunks"]))
    fields["stages"] = _stage_rows(doc, path, where)
    return ManifestEntry(**fields)


def _stage_rows(doc: dict[str, Any], path: Location, where: str) -> tuple[StageRows, ...] | None:
    """``doc["stages"]`` (of an entry or the totals) as stage rows; None when absent or null (no stages)."""
    items = doc.get("stages")
    if items is None:
        return None
    name = f"{where}.stages"
    if not isinstance(items, list) or not items:
        raise InputError(str(path), f"manifest field '{name}' is {json.dumps(items)}, expected a non-empty array")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InputError(str(path), f"manifest field '{name}[{i}]' is {json.dumps(item)}, expected an object")
        dropped = _field(item, "groups_dropped", int, path, f"{name}[{i}]") if "groups_dropped" in item else None
        out.append(StageRows(_field(item, "stage", str, path, f"{name}[{i}]"), _field(item, "rows_in", int, path, f"{name}[{i}]"),
                             _field(item, "rows_out", int, path, f"{name}[{i}]"), dropped))  # fmt: skip
    return tuple(out)


def _split_report(doc: dict[str, Any], stages: tuple[StageRows, ...] | None, path: Location) -> SplitReport:
    """The manifest's ``split``: a role of ``SPLITS``, counts >= 0, its ``rows`` those its ``Split`` stage passed on
    (in the totals)."""
    role = _field(doc, "role", str, path, "split")
    if role not in SPLITS:
        raise InputError(str(path), f"manifest field 'split.role' is {json.dumps(role)}, expected one of {list(SPLITS)}")
    rows = _field(doc, "rows", int, path, "split")
    unseen = []
    for i, u in enumerate(_field(doc, "unseen", list, path, "split")):
        where = f"split.unseen[{i}]"
        if not isinstance(u, dict):
            raise InputError(str(path), f"manifest field '{where}' is {json.dumps(u)}, expected an object")
        unseen.append(Unseen(_field(u, "column", str, path, where), _field(u, "rows", int, path, where), _field(u, "distinct", int, path, where)))
    if min([rows, *(n for u in unseen for n in (u.rows, u.distinct))]) < 0 or any(u.rows > rows for u in unseen):
        raise InputError(str(path), f"manifest field 'split': counts below 0, or unseen values in more than its {rows} rows")
    placed = [s.rows_out for s in stages or () if s.stage == "Split"]
    if placed != [rows]:
        raise InputError(str(path), f"manifest field 'split.rows' is {rows}, but the Split stage of the totals passed on {placed or 'nothing'}")
    return SplitReport(role, _field(doc, "rule", str, path, "split"), rows, tuple(unseen))


def _chunk(doc: Any, path: Location, where: str) -> NpyChunk:
    if not isinstance(doc, dict):
        raise InputError(str(path), f"manifest field '{where}' is {json.dumps(doc)}, expected an object")
    sha = _field(doc, "sha256", dict, path, where)
    return NpyChunk(rows=_field(doc, "rows", int, path, where), sha256={f: _field(sha, f, str, path, f"{where}.sha256") for f in FIELDS})


def _formats(doc: dict[str, Any], path: Location) -> tuple[str, ...]:
    """The manifest's ``formats`` (Parquet only when absent): some of ``FORMATS``, in that order."""
    if "formats" not in doc:
        return ("parquet",)
    formats = _field(doc, "formats", list, path)
    if not formats or formats != [f for f in FORMATS if f in formats]:
        raise InputError(str(path), f"manifest field 'formats' is {json.dumps(formats)}, expected some of {list(FORMATS)} in that order")
    return tuple(formats)


def _npy_spec(doc: dict[str, Any], path: Location) -> NpySpec:
    """The manifest's ``npy``: float32 label and dense, int32 or int64 ids, a label without width, widths >= 0."""
    dtypes = _field(doc, "dtypes", dict, path, "npy")
    widths = _field(doc, "widths", dict, path, "npy")
    spec = NpySpec(
        chunk_rows=_field(doc, "chunk_rows", int, path, "npy"),
        dtypes={f: _field(dtypes, f, str, path, "npy.dtypes") for f in FIELDS},
        widths={f: _field(widths, f, (int, type(None)), path, "npy.widths") for f in FIELDS},
    )
    allowed = {"label": ("<f4",), "dense": ("<f4",), "sparse": ("<i4", "<i8")}
    for f in FIELDS:
        if spec.dtypes[f] not in allowed[f]:
            raise InputError(str(path), f"manifest field 'npy.dtypes.{f}' is {json.dumps(spec.dtypes[f])}, expected one of {list(allowed[f])}")
        width = spec.widths[f]
        if (width is None) != (f == "label") or (width is not None and width < 0):
            expected = "null" if f == "label" else "an integer >= 0"
            raise InputError(str(path), f"manifest field 'npy.widths.{f}' is {json.dumps(width)}, expected {expected}")
    if spec.chunk_rows < 1:
        raise InputError(str(path), f"manifest field 'npy.chunk_rows' is {spec.chunk_rows}, expected an integer >= 1")
    return spec


def check_npy_layout(output: ProcessedOutput, expected: NpySpec) -> None:
    """Raise ``InputError`` naming manifest.json when the npy chunks of ``output`` are not of the dtypes and widths
    of ``expected`` (the spec its pipeline gives, ``etl.io.npy.NpySpec.of``; its chunk rows are not compared)."""
    spec = output.manifest.npy
    if spec is None:
        raise InputError(str(output.directory / MANIFEST), "the output has no npy chunks")
    if (spec.dtypes, spec.widths) != (expected.dtypes, expected.widths):
        raise InputError(str(output.directory / MANIFEST), f"npy chunks of dtypes {spec.dtypes} and widths {spec.widths}, but its pipeline's "
                                                            f"batches have dtypes {expected.dtypes} and widths {expected.widths}")  # fmt: skip


_JSON_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", bool: "true or false", type(None): "null"}


def _field(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Location, where: str = "") -> Any:
    """``doc[key]``, checked to be of ``kind`` (a bool is not an int here)."""
    name = f"{where}.{key}" if where else key
    if key not in doc:
        raise InputError(str(path), f"manifest field '{name}' is missing")
    value = doc[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        expected = " or ".join(_JSON_NAMES[k] for k in kinds)
        raise InputError(str(path), f"manifest field '{name}' is {json.dumps(value)}, expected {expected}")
    return value
