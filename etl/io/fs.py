"""Where files live: local paths and object-storage URLs, behind one small path interface.

A *location* is either a ``pathlib.Path`` (a local file or directory, read and written with the standard library
and polars' local Parquet reader, exactly as before) or a ``Url``: ``s3://``, ``gs://``, ``abfs://``/``az://`` or any
other protocol fsspec knows, read and written through the fsspec filesystem of its protocol. ``location`` makes
one from what a user typed: a ``file://`` URL becomes a local path, a URL is never passed through ``pathlib`` (which
would turn ``s3://b/k`` into ``s3:/b/k``), and Azure's ``abfs://container@account.dfs.core.windows.net/dir`` form
has its account moved into the storage options.

``Url`` offers the part of the ``pathlib.Path`` interface the package uses (``/``, ``name``, ``parent``,
``with_name``, ``exists``, ``is_file``, ``is_dir``, ``iterdir``, ``glob``, ``open``, ``read_bytes``, ``unlink``,
``mkdir``, ``resolve``), so the modules that own a file format handle both kinds with the same code; what differs
(Parquet access through pyarrow, renames, file fingerprints) is in the helpers below.

fsspec is the one abstraction, rather than ``pyarrow.fs``: it covers every store through one interface (s3fs,
gcsfs, adlfs, and any other implementation), its ``storage_options`` are what pandas, Dask and polars users already
pass, Dask uses it for its own I/O, and pyarrow's Parquet reader and writers work on its files. Local paths do not
go through it: they keep the standard library and polars' fast local reader.

Credentials and endpoints come the standard way of each filesystem: for S3 the ``AWS_*`` environment variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ...) and the AWS config
files; for GCS ``GOOGLE_APPLICATION_CREDENTIALS``; for Azure ``AZURE_STORAGE_*``. Python APIs also take
``storage_options`` (keyword arguments of the fsspec filesystem, e.g. ``{"endpoint_url": ..., "anon": True}``),
which travel with the ``Url`` to every file under it, also into worker processes.

Object stores have no directories, symlinks or atomic renames: ``mkdir`` does nothing (a missing bucket is reported
by the first write), ``replace`` copies the object to its final key and removes the source (the final object
appears whole, since an upload or a copy completes all at once), and a file written through ``Url.open`` that fails
before ``close`` is discarded rather than completed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeAlias, cast

from etl.errors import ConfigError, OutputError

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class Url:
    """A file or directory (a key prefix) in object storage, as ``scheme://bucket/key`` without a trailing slash,
    with the ``storage_options`` of its filesystem (compared with the URL, but left out of the hash: a dict is not
    hashable). A ``Url`` pickles as its text and options, so it can be sent to other processes."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict, hash=False)

    def __str__(self) -> str:
        return self.url

    # ------------------------------------------------------------------ names
    @property
    def protocol(self) -> str:
        m = _SCHEME.match(self.url)
        return m.group(1) if m else ""

    @property
    def key(self) -> str:
        """The path inside the filesystem (``bucket/key``), as fsspec names it."""
        return self.url[len(self.protocol) + 3 :]

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> Url:
        head = self.key.rsplit("/", 1)[0] if "/" in self.key else self.key
        return self._at(head)

    def with_name(self, name: str) -> Url:
        return self.parent / name

    def __truediv__(self, name: str) -> Url:
        return self._at(f"{self.key}/{name.strip('/')}")

    def _at(self, key: str) -> Url:
        return Url(f"{self.protocol}://{key}", self.storage_options)

    def is_relative_to(self, other: Path | Url) -> bool:
        return isinstance(other, Url) and (self.url == other.url or self.url.startswith(other.url + "/"))

    def resolve(self) -> Url:
        return self

    # ------------------------------------------------------------------ the filesystem
    @property
    def fs(self) -> Any:
        """The fsspec filesystem of this URL (fsspec keeps one instance per protocol, options and process), without
        a cache of listings: every listing and existence check asks the store, since other processes write there."""
        return _filesystem(self.protocol, self.storage_options)

    def exists(self) -> bool:
        with accessing(self):
            return bool(self.fs.exists(self.key))

    def is_file(self) -> bool:
        with accessing(self):
            return bool(self.fs.isfile(self.key))

    def is_dir(self) -> bool:
        with accessing(self):
            return bool(self.fs.isdir(self.key))

    def is_symlink(self) -> bool:
        return False

    def iterdir(self) -> Iterator[Url]:
        """The entries directly under this prefix, freshly listed."""
        with accessing(self):
            keys = sorted(self.fs.ls(self.key, detail=False))
        for key in keys:
            if key.rstrip("/") != self.key:
                yield self._at(key.rstrip("/"))

    def glob(self, pattern: str) -> Iterator[Url]:
        """The entries matching ``pattern`` under this prefix (fsspec glob rules), freshly listed."""
        with accessing(self):
            keys = sorted(self.fs.glob(f"{self.key}/{pattern}"))
        for key in keys:
            yield self._at(key)

    def open(self, mode: str = "rb") -> IO[Any]:
        """The object opened for binary reading (``rb``) or writing (``wb``). A write becomes visible when the file
        is closed; closing after an exception inside a ``with`` block discards it instead."""
        with accessing(self):
            f = self.fs.open(self.key, mode)
        return cast(IO[Any], f if mode == "rb" else _Upload(f, self))

    def read_bytes(self) -> bytes:
        with accessing(self):
            return bytes(self.fs.cat_file(self.key))

    def write_bytes(self, data: bytes) -> None:
        """Write the object in one request (it appears whole or not at all)."""
        with writing(self):
            self.fs.pipe_file(self.key, data)

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            with accessing(self):
                self.fs.rm_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: prefixes exist as soon as an object is written under them."""


class _Upload:
    """A writable object-storage file: ``close`` completes the upload, leaving a ``with`` block by an exception
    discards it (so a failed write never completes an object)."""

    def __init__(self, f: Any, url: Url):
        self._f, self.url = f, url

    def write(self, data: Any) -> int:
        with writing(self.url):
            return int(self._f.write(data))

    def flush(self) -> None:
        with writing(self.url):
            self._f.flush()

    def tell(self) -> int:
        return int(self._f.tell())

    @property
    def closed(self) -> bool:
        return bool(self._f.closed)

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        with writing(self.url):
            self._f.close()

    def discard(self) -> None:
        """Drop what was written (and any multipart upload begun) without creating the object."""
        if not self._f.closed:
            self._f.discard()
            self._f.closed = True

    def __enter__(self) -> _Upload:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


@contextlib.contextmanager
def writing(url: Url) -> Iterator[None]:
    """Report a failed write to object storage (a missing bucket, denied access, a network error) as an
    ``OutputError`` naming ``url``; a store that cannot be reached at all is ``accessing``'s ``ConfigError``."""
    try:
        with accessing(url):
            yield
    except OSError as e:
        raise OutputError(f"{url}: cannot write: {e}") from None


#: Where each protocol's filesystem takes its credentials and endpoint from, as error messages name them.
_CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_ENDPOINT_URL",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS",
    "abfs": "AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_KEY, AZURE_STORAGE_CONNECTION_STRING",
    "az": "AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_KEY, AZURE_STORAGE_CONNECTION_STRING",
}


@contextlib.contextmanager
def accessing(url: Url) -> Iterator[None]:
    """Report object storage that cannot be used at all (no credentials, credentials refused, an endpoint that does
    not answer) as a ``ConfigError`` naming ``url`` and where the credentials come from. A missing object or bucket
    stays ``FileNotFoundError``, and any other ``OSError`` stays itself, for the caller to report in its terms."""
    try:
        yield
    except PermissionError as e:
        raise ConfigError(f"{url}: access denied: {e}{_where_credentials(url)}") from None
    except _access_errors() as e:
        raise ConfigError(f"{url}: cannot access object storage: {e}{_where_credentials(url)}") from None


def _where_credentials(url: Url) -> str:
    where = _CREDENTIALS.get(url.protocol)
    return f" (credentials and endpoint come from storage_options or the environment: {where})" if where else ""


@functools.cache
def _access_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of the installed storage clients that mean a store cannot be reached or refuses the
    credentials (their modules are imported only when object storage fails)."""
    found: list[type[BaseException]] = []
    for module, names in (
        ("botocore.exceptions", ("NoCredentialsError", "PartialCredentialsError", "EndpointConnectionError", "ConnectTimeoutError",
                                 "NoRegionError", "ClientError")),
        ("google.auth.exceptions", ("GoogleAuthError",)),
        ("azure.core.exceptions", ("ClientAuthenticationError", "ServiceRequestError")),
    ):  # fmt: skip
        try:
            errors = importlib.import_module(module)
        except ImportError:
            continue
        found += [getattr(errors, name) for name in names if hasattr(errors, name)]
    return tuple(found)


def _filesystem(protocol: str, options: dict[str, Any]) -> Any:
    import fsspec

    try:  # no cached listings: other processes (workers, producers, other runs) write under the same prefixes
        return fsspec.filesystem(protocol, **{"use_listings_cache": False, **options})
    except (ImportError, ValueError) as e:
        raise ConfigError(f"{protocol}:// paths: {e} (object storage needs the 'dist' extra: pip install 'etl[dist]')") from None


#: A file or directory: local, or in object storage.
Location: TypeAlias = Path | Url


def location(item: str | Path | Url, storage_options: dict[str, Any] | None = None) -> Location:
    """The location ``item`` names: a ``Url`` for ``scheme://...`` (trailing slashes dropped; ``storage_options``
    attached unless ``item`` is already a ``Url``), a local ``Path`` for a ``file://`` URL and for anything else."""
    if isinstance(item, Url | Path):
        return item
    m = _SCHEME.match(item)
    if m is None:
        return Path(item)
    if m.group(1) == "file":
        return Path(item[len("file://") :])
    return _url(item, m.group(1), dict(storage_options or {}))


def _url(item: str, protocol: str, options: dict[str, Any]) -> Url:
    """The ``Url`` of ``item``. What the protocol's filesystem reads from a URL besides the path (the account of
    ``abfs://container@account.dfs.core.windows.net/dir``) moves into the storage options (``options`` win), and the
    URL keeps the path alone (``abfs://container/dir``): every URL under it, listed, globbed or joined, then names
    the same store. A protocol whose filesystem is not installed is left as typed (its first use reports it)."""
    import fsspec

    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):
        return Url(item.rstrip("/"), options)
    from_url = cls._get_kwargs_from_urls(item)
    if not from_url:
        return Url(item.rstrip("/"), options)
    return Url(f"{protocol}://{cls._strip_protocol(item).rstrip('/')}", from_url | options)


def locations(items: list[str | Path | Url], storage_options: dict[str, Any] | None = None) -> list[Location]:
    """``location`` of each item."""
    return [location(i, storage_options) for i in items]


def identity(path: Location) -> tuple[int, ...]:
    """What changes when a file is replaced or rewritten, cheaply (one ``stat``, no read): (device, inode, size,
    modification time and status change time in ns) of a local file, ``fingerprint`` of a URL. The status change
    time cannot be set back, so a rewrite in place that keeps the size and sets the modification time back is seen
    too (so is a ``chmod``: a change that proves nothing, where the caller's sha256 check then finds the same
    bytes). The sha256 of a manifest entry is what proves bytes."""
    if not isinstance(path, Url):
        st = os.stat(path)
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
    return fingerprint(path)


def current_identity(path: Location) -> tuple[int, ...] | None:
    """``identity`` of ``path``; None when there is no such file (it was removed)."""
    try:
        return identity(path)
    except FileNotFoundError:
        return None


def fingerprint(path: Location) -> tuple[int, int]:
    """(size in bytes, modification time in ns) of a file: from ``stat`` for a local one, from the object's
    metadata for a URL (its last-modified time; a store without one gives 0)."""
    if not isinstance(path, Url):
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns
    with accessing(path):
        info = path.fs.info(path.key)
    mtime = info.get("LastModified") or info.get("mtime") or info.get("updated") or info.get("last_modified")
    if hasattr(mtime, "timestamp"):
        ns = int(mtime.timestamp() * 10**6) * 1000
    elif isinstance(mtime, int | float):
        ns = int(mtime * 10**9)
    else:
        ns = 0
    return int(info["size"]), ns


def is_within(path: Location, root: Location) -> bool:
    """Whether ``path`` is ``root`` or lies under it (both local or both URLs; a local path is never within a URL
    and the other way round). Local paths are compared as given: resolve them first to follow symlinks."""
    if isinstance(path, Path) and isinstance(root, Path):
        return path.is_relative_to(root)
    return isinstance(path, Url) and path.is_relative_to(root)


def replace(src: Location, dst: Location) -> None:
    """Move ``src`` onto ``dst`` (same kind of location): ``os.replace`` locally (atomic); in object storage a
    server-side copy, which makes ``dst`` appear whole, then the removal of ``src``."""
    if isinstance(src, Url) and isinstance(dst, Url):
        with writing(dst):
            src.fs.mv(src.key, dst.key)
    elif isinstance(src, Url) or isinstance(dst, Url):
        raise ValueError(f"cannot move {src} onto {dst}: not the same kind of location")
    else:
        os.replace(src, dst)


def remove_tree(path: Location) -> None:
    """Remove ``path`` and everything under it, if anything is there: ``shutil.rmtree`` for a local directory (not
    through a symlink: a link itself is unlinked), ``os.unlink`` for any other local entry, a recursive removal of
    the object and every key under its prefix for a URL."""
    if isinstance(path, Url):
        with writing(path), contextlib.suppress(FileNotFoundError):
            path.fs.rm(path.key, recursive=True)
    elif path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def open_file(path: str | Location, mode: str = "rb") -> IO[Any]:
    """``path`` opened in binary ``mode`` (``rb`` or ``wb``): a local path (or a string naming one) with ``open``,
    a URL with ``Url.open``."""
    return path.open(mode) if isinstance(path, Url) else open(path, mode)


def arrow_source(path: Location) -> tuple[Any, Any]:
    """(source, filesystem) to hand pyarrow's Parquet functions (``pq.ParquetFile(source, filesystem=...)``):
    the local path and None, or the key and the URL's fsspec filesystem."""
    if isinstance(path, Url):
        return path.key, path.fs
    return path, None
