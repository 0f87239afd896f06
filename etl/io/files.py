"""Files we write: shard names, temporary names, atomic writes, checksums.

Shard names are ``part-00000.parquet``, ``part-00001.parquet``, ...: the index zero-padded to five digits, wider
past ``part-99999.parquet`` (``part-100000.parquet``). Their text order is therefore their index order only below
100000: whatever orders shards orders them by ``shard_index``.

Every file is written under a hidden temporary name in its final directory and renamed onto its final name once
complete (``os.replace``: atomic on one file system), so a reader never sees a partial file under a final name.
Temporary names are ``.<final name>.<pid>-<random>.tmp``: unique per writer, recognisable by ``is_temporary``
(an interrupted run leaves them behind; the next run of the same command removes them). Temporaries are created
by ``open_exclusive``: never an existing file, never through a symlink planted at the temporary name.

The directories under an output directory are written into and cleaned of temporaries through their paths, so one
that is a symbolic link would take the writes and lose its temporary-named files wherever it points: a run refuses
such links first (``check_no_linked_directories``).

Every function here also takes an object-storage ``etl.io.fs.Url``: the same names are used, a "rename" is
``etl.io.fs.replace`` (a copy that makes the final object appear whole), and the single-object writes
(``atomic_write_bytes``, ``atomic_write_parquet``) go straight to their final key, where an object appears only once
its upload completes.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import secrets
from pathlib import Path
from typing import Any, BinaryIO, NoReturn, cast, overload

import pyarrow as pa
import pyarrow.parquet as pq

from etl.errors import OutputError
from etl.io.fs import Location, Url, open_file, remove_tree, replace

_SHARD_RE = re.compile(r"part-(\d{5,})\.parquet")
_TMP_SUFFIX = ".tmp"


def shard_name(index: int) -> str:
    """File name of the ``index``-th shard: ``part-00000.parquet``, ``part-00001.parquet``, ..."""
    return f"part-{index:05d}.parquet"


def shard_index(name: str) -> int:
    """The index of the shard named ``name`` (``shard_name(shard_index(name)) == name``); ValueError when no index
    has this name (``part-012345.parquet``, say: shard 12345 is ``part-12345.parquet``)."""
    match = _SHARD_RE.fullmatch(name)
    if match is None or shard_name(int(match[1])) != name:
        raise ValueError(f"{name!r} is not a shard name such as {shard_name(0)!r}")
    return int(match[1])


def is_shard_name(name: str) -> bool:
    """Whether ``name`` is a shard name made by ``shard_name`` (one index, one name)."""
    try:
        shard_index(name)
    except ValueError:
        return False
    return True


@overload
def temporary_path(path: Path) -> Path: ...
@overload
def temporary_path(path: Location) -> Location: ...
def temporary_path(path: Location) -> Location:
    """A fresh temporary name for writing ``path``, in the same directory (so the final rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{_TMP_SUFFIX}")


class _NamedWriter(io.BufferedWriter):
    """A buffered binary file whose OSErrors (disk full, ...) name its path."""

    def __init__(self, raw: io.FileIO, path: Path):
        super().__init__(raw)
        self.path = path

    def _named(self, e: OSError) -> OSError:
        return e if e.filename is not None else OSError(e.errno, e.strerror, str(self.path))

    def write(self, data: Any) -> int:
        try:
            return super().write(data)
        except OSError as e:
            raise self._named(e) from e

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as e:
            raise self._named(e) from e

    def close(self) -> None:
        try:
            super().close()
        except OSError as e:
            raise self._named(e) from e


def open_exclusive(path: Location) -> BinaryIO:
    """Create ``path`` for writing (binary); fails with FileExistsError when anything exists at ``path``, a
    symlink included (O_CREAT | O_EXCL | O_NOFOLLOW), so a write never goes through a planted link. An OSError
    while writing names ``path``. A URL is opened for upload (object stores have no links; the names written
    through this function are fresh temporary names)."""
    if isinstance(path, Url):
        return cast(BinaryIO, path.open("wb"))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    return _NamedWriter(io.FileIO(fd, "wb"), path)


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary name made by ``temporary_path``."""
    return name.startswith(".") and name.endswith(_TMP_SUFFIX)


def remove_temporaries(directory: Location) -> None:
    """Remove the temporaries an interrupted writer left in ``directory``: files, and directories with a temporary
    name and all they hold (the work directory of a distributed fit); other entries are not looked into."""
    if directory.is_dir():
        for p in directory.iterdir():
            if is_temporary(p.name):
                remove_tree(p)


def check_no_linked_directories(root: Location) -> None:
    """Raise ``OutputError`` naming the first symbolic link found under the directory ``root`` (``root`` itself may be
    one: the user named it) that points to a directory, or to nothing (it may become one), looking through real
    directories only: what a run writes into or removes from the directories under ``root`` would land outside it.
    A link to a file is left alone: files are replaced by a rename and removed by an unlink, which act on the link,
    never on its target. Nothing to check when ``root`` does not exist, nor in object storage (no links)."""
    if isinstance(root, Url) or not root.is_dir():
        return
    directories = [root]
    while directories:
        with os.scandir(directories.pop()) as entries:
            for entry in entries:
                if entry.is_symlink():
                    if entry.is_dir() or not os.path.exists(entry.path):
                        _refuse_link(root, Path(entry.path))
                elif entry.is_dir():
                    directories.append(Path(entry.path))


def _refuse_link(root: Path, link: Path) -> NoReturn:
    target = os.readlink(link)
    what = f"the directory {target}" if link.is_dir() else f"nothing ({target})"
    raise OutputError(f"{link}: a symbolic link to {what} inside {root}: files written or removed through it would land outside it; "
                      "remove the link")  # fmt: skip


def atomic_write_bytes(path: Location, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (a URL: in one upload)."""
    if isinstance(path, Url):
        path.write_bytes(data)
        return
    tmp = temporary_path(path)
    try:
        with open_exclusive(tmp) as f:
            f.write(data)
        replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


WRITE_BUFFER_BYTES = 1 << 20
"""What ``buffered_stream`` gathers before one write to the Python file beneath it."""


def buffered_stream(f: BinaryIO | HashingFile) -> pa.NativeFile:
    """An Arrow output stream onto the Python file ``f`` that hands it ``WRITE_BUFFER_BYTES`` at a time; closing
    the stream flushes it and closes ``f``. Arrow's Parquet writer writes every page header and page apart (about
    560 writes per 131,072-row row group of a Criteo output: 40 columns, pages of at most 20,000 rows) and each
    write to a Python file takes the GIL: with another thread running Python, each of them waits for that
    thread's switch interval (5 ms), so an unbuffered write of one such file in a thread could take seconds
    instead of tens of milliseconds. Same bytes, in fewer and larger writes."""
    return pa.output_stream(f, compression=None, buffer_size=WRITE_BUFFER_BYTES)


def atomic_write_parquet(table: pa.Table, path: Location, **options: Any) -> None:
    """Write ``table`` as Parquet (``options`` go to ``pyarrow.parquet.write_table``) through a temporary file
    and a rename (a URL: in one upload, completed only when the whole file is written); through
    ``buffered_stream``."""
    if isinstance(path, Url):
        with buffered_stream(cast(BinaryIO, path.open("wb"))) as f:
            pq.write_table(table, f, **options)
        return
    tmp = temporary_path(path)
    try:
        with buffered_stream(open_exclusive(tmp)) as f:
            pq.write_table(table, f, **options)
        replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class ExclusiveParquetWriter(pq.ParquetWriter):
    """A ``pyarrow.parquet.ParquetWriter`` onto a new file created with ``open_exclusive``, through
    ``buffered_stream`` (``options`` go to ``ParquetWriter``); ``close()`` closes the file too."""

    def __init__(self, path: Location, schema: pa.Schema, **options: Any):
        self._file = buffered_stream(open_exclusive(path))
        try:
            super().__init__(self._file, schema, **options)
        except BaseException:
            self._file.close()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._file.close()


def sha256_file(path: Location) -> str:
    """Hex sha256 of the file's bytes."""
    h = hashlib.sha256()
    with open_file(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class HashingFile:
    """A write-only file that computes the sha256 of what is written to it as it goes (Parquet writers write
    sequentially, so this is the checksum of the finished file, without reading it back). ``path`` is created
    with ``open_exclusive``."""

    def __init__(self, path: Location):
        self._f = open_exclusive(path)
        self._h = hashlib.sha256()
        self.closed = False

    def write(self, data: bytes) -> int:
        self._h.update(data)  # releases the GIL for large buffers
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self.closed:
            self._f.close()
            self.closed = True

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def __enter__(self) -> HashingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
