"""The producer manifest: a file in which the producer of a followed directory lists its shards in arrival order.

A producer that cannot name its shards so that name order is arrival order (names taken from a content hash, a
host name, a clock that may step back), or that writes each shard in place under its final name, lists its shards
in ``_arrivals.json`` in the directory it fills, and a consumer follows them with ``arrivals="manifest"``
(``etl.io.arrivals``)::

    {"format": "etl-arrivals", "version": 1, "shards": ["b7e1.parquet", "a03f.parquet", "c2d9.parquet"]}

The producer's rules:

- ``shards`` lists file names of the directory, in the order the shards arrived. A shard is listed once it is
  complete: the listing is what makes it count, so the shard itself may be written in place.
- A name is a plain file name that ends in ``.parquet``: no ``/`` nor ``\\``, not hidden (no leading ``.``, so
  neither ``..`` nor a temporary name of ``etl.io.files``), listed once.
- Each new version of the file extends the one before: it appends names at the end, and never removes, reorders
  or renames an entry (a consumer that has delivered a shard's rows cannot take them back).
- The file is replaced as a whole, atomically: written under a temporary name and renamed onto ``_arrivals.json``
  (``write_arrivals`` does it); in object storage, written in one upload (an object appears only once complete).

Why ``_arrivals.json``: a leading underscore marks a data set's metadata beside its data files (as Hadoop's
``_SUCCESS`` and Parquet's ``_metadata`` do); the name does not end in ``.parquet``, so every reader of the
directory's shards (``etl.io.parquet.list_shards``, a following loader in name order) leaves it out; it is not
hidden, so it is never taken for a temporary left by an interrupted writer (``etl.io.files.is_temporary``, which
``remove_temporaries`` deletes); and it is not ``manifest.json``, which marks the output of ``etl preprocess``
(``etl.io.processed``).

The consumer's side (``arrived_since``) treats the file as untrusted input: each read parses and checks all of it,
and every breach of the rules above is an ``InputError`` naming the file (and the entry), never a shard skipped or
delivered out of order: a file that cannot be read or parsed (the atomic replacement rules out a torn read, so a
parse error is the producer's), another format or version, another key, an entry that is not a shard's name, a
name listed twice, a listing that does not extend the one read before, a newly listed shard that is not a file in
the directory, and a file that disappears once read. Before the producer writes the file for the first time, the
directory has no shard that counts: the consumer waits and reads again at its next poll.
"""

from __future__ import annotations

import json
from typing import Any

from etl.errors import ConfigError, InputError
from etl.io.documents import parse_document
from etl.io.files import atomic_write_bytes
from etl.io.fs import Location

ARRIVALS = "_arrivals.json"
FORMAT = "etl-arrivals"
VERSION = 1
_KEYS = {"format", "version", "shards"}


def write_arrivals(directory: Location, shards: list[str]) -> None:
    """Replace ``directory``/_arrivals.json, atomically, with the listing of ``shards`` in arrival order. A producer
    calls it after each shard it adds, with the listing so far. ``ConfigError`` for a name the rules refuse."""
    for i, name in enumerate(shards):
        problem = _name_problem(name)
        if problem is not None:
            raise ConfigError(f"{directory / ARRIVALS}: shards[{i}] = {name!r}: {problem}")
    if len(set(shards)) != len(shards):
        raise ConfigError(f"{directory / ARRIVALS}: a shard is listed twice")
    doc = {"format": FORMAT, "version": VERSION, "shards": shards}
    atomic_write_bytes(directory / ARRIVALS, (json.dumps(doc, indent=1) + "\n").encode())


def read_arrivals(directory: Location) -> list[str] | None:
    """The shards ``directory``/_arrivals.json lists, in arrival order; None when the file does not exist (yet).
    ``InputError`` naming the file (and the entry) when it breaks a rule that one version of the file can break (see
    the module docstring)."""
    path = directory / ARRIVALS
    try:
        doc = parse_document(path.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InputError(str(path), f"cannot read the producer manifest: {e.strerror or e}") from None
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError, nested too deeply
        raise InputError(str(path), f"not a JSON producer manifest: {e}") from None
    return _shards(doc, str(path))


def arrived_since(directory: Location, before: list[str]) -> list[str]:
    """The shards the producer manifest of ``directory`` lists after ``before`` (the listing read before, empty at
    first), each checked to be a file. Nothing while the manifest does not exist and nothing was listed before.
    ``InputError`` naming the manifest (and the entry) for a breach of the rules (see the module docstring)."""
    path = directory / ARRIVALS
    listing = read_arrivals(directory)
    if listing is None:
        if before:
            raise InputError(str(path), f"the producer manifest disappeared after listing {len(before)} shard(s): it must be replaced, never removed")
        return []
    for i, (was, now) in enumerate(zip(before, listing, strict=False)):
        if was != now:
            raise InputError(str(path), f"shards[{i}] is now {now!r}, and was {was!r}: a listing may only grow at its end (a shard "
                             "was removed or the shards reordered)")  # fmt: skip
    if len(listing) < len(before):
        raise InputError(str(path), f"lists {len(listing)} shard(s), fewer than the {len(before)} it listed before: {before[len(listing)]!r} "
                         "and any after it were removed")  # fmt: skip
    new = listing[len(before) :]
    for i, name in enumerate(new, len(before)):
        if not _is_file(directory / name):
            raise InputError(str(path), f"shards[{i}] = {name!r}: listed, but {directory / name} is not a file (list a shard only once "
                             "it is written)")  # fmt: skip
    return new


def _shards(doc: Any, path: str) -> list[str]:
    """The ``shards`` of a parsed producer manifest, after checking everything one version of it must satisfy."""
    if not isinstance(doc, dict):
        raise InputError(path, f"not a JSON producer manifest: expected an object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        found = f"format {doc.get('format')!r} version {doc.get('version')!r}"
        raise InputError(path, f"producer manifest {found}, expected format {FORMAT!r} version {VERSION}")
    if set(doc) != _KEYS:
        raise InputError(path, f"a producer manifest has the keys {sorted(_KEYS)}, this one {sorted(doc)}")
    shards = doc["shards"]
    if not isinstance(shards, list):
        raise InputError(path, f"'shards' must be a list of file names, got {type(shards).__name__}")
    seen: set[str] = set()
    for i, name in enumerate(shards):
        problem = _name_problem(name)
        if problem is not None:
            raise InputError(path, f"shards[{i}] = {name!r}: {problem}")
        if name in seen:
            raise InputError(path, f"shards[{i}] = {name!r}: listed twice")
        seen.add(name)
    return shards


def _name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be listed as a shard of the directory (None: it can)."""
    if not isinstance(name, str):
        return f"a shard's name is a string, not {type(name).__name__}"
    if "/" in name or "\\" in name or "\0" in name or name.startswith("."):
        return "not a plain file name in the directory (no '/' nor '\\', not hidden or temporary)"
    if not name.endswith(".parquet"):
        return "a shard's name ends in .parquet"
    return None


def _is_file(path: Location) -> bool:
    """Whether ``path`` is a file; ``InputError`` naming it when that cannot be found out."""
    try:
        return path.is_file()
    except OSError as e:
        raise InputError(str(path), f"cannot check the listed shard: {e}") from None
