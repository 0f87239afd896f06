"""The shards of a directory that a producer keeps filling, in arrival order (follow mode).

There are two arrival orders, which the consumer chooses (``ORDERS``; never guessed from what the directory holds,
since a producer's manifest written a moment after the consumer starts would otherwise change the order):

- ``"names"``: name order. A producer names its shards so that each new one sorts after every earlier one
  (``part-00000.parquet``, ``part-00001.parquet``, ... or a zero-padded timestamp). Shard names as
  ``etl.io.files.shard_name`` makes them sort by their index, as ``etl.io.parquet.list_shards`` takes them
  (``part-99999.parquet``, then ``part-100000.parquet``); other names as strings. A shard counts once it is
  complete, which the producer signals by writing it under a temporary name that does not end in ``.parquet``
  (``etl.io.files.temporary_path`` makes one) and renaming it onto its final name (in object storage, the object
  appears whole once its upload or copy completes). The entries ``etl.io.parquet.list_shards`` takes from a
  directory are the candidates: ``*.parquet`` regular files, no temporaries, no subdirectories. A shard that appears
  with a name sorting before a shard already seen broke the rule: it would land in the middle of rows already
  delivered, so ``Arrivals.poll`` raises ``InputError`` naming it rather than skip it or deliver it out of order.
  A directory that holds a producer manifest is refused in this order (``InputError`` at the first poll, and at
  every poll that finds new shards): its producer lists its shards, and may write them in place, so their names say
  neither their order nor whether they are complete; so is one that holds the manifest.json of a processed output
  (a following loader started on an output directory before ``etl preprocess --follow`` wrote its manifest.json
  would otherwise take its files for raw shards).
- ``"manifest"``: the order the producer's manifest lists them in (``etl.io.arrivals_manifest``: ``_arrivals.json``
  in the directory, replaced atomically, each version extending the one before). A shard counts once listed; other
  files of the directory are not looked at. Until the producer writes the manifest, no shard has arrived; while
  nothing is listed, a directory that holds the manifest.json of a processed output is refused (``InputError``), as
  in name order: its producer manifest would never come.

The output of ``etl preprocess --follow`` (a processed output, ``etl.io.processed``) is followed in its own order,
``PROCESSED``, which its directory decides (its manifest.json marks it), not the consumer: output file ``i`` holds
the rows of the ``i``-th input shard to arrive, and counts once manifest.json lists it and every file before it (a
following run may commit a file before the one ahead of it); each is checked as ``open_processed`` checks the files
it reads (``etl.io.processed.committed_parts``), and, given the checksum of the artifacts its reader opened, must
have been transformed with them (its entry's ``artifacts_sha256``, when it records one). A file once counted must
stay listed with the same sha256 (a rerun of ``etl preprocess --follow`` with other artifacts rewrites its files:
``InputError``, as for a file a rerun wrote before a consumer that started again counts it). The entry each file
was counted with goes into a ``CountedFiles`` record, which the reader of the files checks each one against
(``etl.loader.pieces.ProcessedReader``): a file rewritten between the poll that counted it and the reading of its
rows then fails its check, rather than pass against the manifest entry rewritten with it.

Shards are never expected to disappear: a consumer that restarts from a saved position finds the shards before it
by counting them (``Arrivals.check_before``).
"""

from __future__ import annotations

import threading

from etl.errors import ConfigError, InputError
from etl.io.arrivals_manifest import ARRIVALS, arrived_since
from etl.io.files import is_shard_name, is_temporary, shard_index
from etl.io.fs import Location
from etl.io.processed import MANIFEST, ManifestEntry, committed_parts, read_manifest

#: The arrival orders a consumer may follow a directory of raw shards in (see the module docstring).
ORDERS = ("names", "manifest")
#: The order of the files of a processed output (see the module docstring).
PROCESSED = "processed"


def check_order(order: str) -> None:
    """``ConfigError`` unless ``order`` is one of ``ORDERS``."""
    if order not in ORDERS:
        raise ConfigError(f"arrivals must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")


class CountedFiles:
    """The manifest entries of the files of a processed output as the polls that counted them read them (processed
    order), by file name: what each file's bytes must match when its rows are read. Shared by the polling thread,
    which adds entries, and the reading threads, which look them up."""

    def __init__(self) -> None:
        self._entries: dict[str, ManifestEntry] = {}
        self._lock = threading.Lock()

    def add(self, entries: list[ManifestEntry]) -> None:
        """Record ``entries`` (files just counted)."""
        with self._lock:
            self._entries.update((e.output, e) for e in entries)

    def entry(self, name: str) -> ManifestEntry | None:
        """The entry the file ``name`` was counted with; None when it was not counted."""
        with self._lock:
            return self._entries.get(name)

    def sha256s(self) -> dict[str, str | None]:
        """The checksum each counted file was counted with, by file name."""
        with self._lock:
            return {name: e.sha256 for name, e in self._entries.items()}


class Arrivals:
    """The complete shards of ``directory`` in arrival order (``order``: one of ``ORDERS``, or ``PROCESSED`` for the
    files of a processed output): ``poll`` returns those that arrived since the previous call (all of them, on the
    first). ``artifacts_sha256``: in the processed order, the checksum of the artifacts' pipeline.json that every
    file must have been transformed with (None: not checked). ``counted``: in the processed order, where the entries
    of the files counted go (a new record when None); the files it holds already (counted by an earlier pass over the
    same output) must stand as they were, as the ones this object counts."""

    def __init__(self, directory: Location, order: str = "names", artifacts_sha256: str | None = None, counted: CountedFiles | None = None):
        if order != PROCESSED:
            check_order(order)
        self.directory, self.order, self.artifacts_sha256 = directory, order, artifacts_sha256
        self.names: list[str] = []  # every shard seen, in arrival order
        self._seen: set[str] = set()  # the same, in name order only
        self.counted = counted if counted is not None else CountedFiles()  # the same, in the processed order only, with their entries
        self._polled = False

    def poll(self) -> list[Location]:
        """The shards that arrived since the last poll, in arrival order. ``InputError`` for a directory that cannot
        be listed, and for a breach of the order's rules (see the module docstring)."""
        if self.order == "names":
            new = self._by_name()
        elif self.order == "manifest":
            new = arrived_since(self.directory, self.names)
            if not self.names and not new:  # nothing listed yet: is the producer manifest awaited in vain?
                try:
                    self._check_not_processed()
                except OSError as e:
                    raise InputError(str(self.directory), f"cannot list: {e}") from None
        else:
            new = self._committed()
        self._polled = True
        self.names.extend(new)
        return [self.directory / name for name in new]

    def _committed(self) -> list[str]:
        """The files of a processed output committed since the last poll and after every file before them; the
        files counted before must stand as they were."""
        manifest = read_manifest(self.directory)
        listed = {e.output: e.sha256 for e in manifest.files}
        for name, sha256 in self.counted.sha256s().items():
            if listed.get(name, "") != sha256:
                now = "rewritten" if name in listed else "gone"
                raise InputError(str(self.directory / MANIFEST), f"{name}: its rows were counted, and it is now {now}: a file of a followed "
                                 "output must stay as it was (was etl preprocess --follow run again with other artifacts?)")  # fmt: skip
        new = committed_parts(self.directory, manifest, len(self.names))
        for path, entry in new:
            if self.artifacts_sha256 is not None and entry.artifacts_sha256 not in (None, self.artifacts_sha256):
                raise InputError(str(self.directory / MANIFEST), f"{path.name}: transformed with other artifacts (pipeline.json sha256 "
                                 f"{entry.artifacts_sha256}) than the ones this reader opened ({self.artifacts_sha256}): was etl "
                                 "preprocess run again over this output with other artifacts?")  # fmt: skip
        self.counted.add([entry for _, entry in new])
        return [path.name for path, _ in new]

    def _by_name(self) -> list[str]:
        """The complete shards not seen before, in name order; each must sort after every shard seen before."""
        try:
            found = sorted((p.name for p in self.directory.glob("*.parquet") if not is_temporary(p.name) and p.name not in self._seen),
                           key=_name_order)
            new = [name for name in found if not (self.directory / name).is_dir()]
            if new or not self._polled:
                self._check_unmarked()
        except OSError as e:
            raise InputError(str(self.directory), f"cannot list: {e}") from None
        if new and self.names and _name_order(new[0]) < _name_order(self.names[-1]):
            raise InputError(str(self.directory / new[0]), f"arrived after {self.names[-1]} although its name sorts before it: shards must "
                             "arrive in name order (write each one under a temporary name and rename it once complete)")  # fmt: skip
        self._seen.update(new)
        return new

    def _check_unmarked(self) -> None:
        """``InputError`` when the directory holds a producer manifest or the manifest of a processed output: its
        ``*.parquet`` files are then not raw shards that count in name order."""
        if (self.directory / ARRIVALS).is_file():
            raise InputError(str(self.directory / ARRIVALS), "a producer manifest lists this directory's shards: follow it in the "
                             "order it lists them (arrivals='manifest', or --arrivals manifest)")  # fmt: skip
        self._check_not_processed()

    def _check_not_processed(self) -> None:
        """``InputError`` when the directory holds the manifest of a processed output."""
        if (self.directory / MANIFEST).is_file():
            raise InputError(str(self.directory / MANIFEST), "this directory is the output of etl preprocess, not raw shards: a following "
                             "loader reads it as such when it holds its manifest.json at start")  # fmt: skip

    def check_before(self, count: int, name: str | None) -> None:
        """Check that the ``count``-th shard (from 0) seen so far is ``name`` (None: no shard at all was seen when
        the position was saved, then ``count`` is 0): the shards before a saved position are the ones it counted.
        ``InputError`` otherwise (a shard was removed, or added out of order while the consumer was stopped)."""
        if name is None:
            if count:
                raise InputError(str(self.directory), f"a saved position counts {count} shard(s) before a missing shard")
            return
        if count >= len(self.names) or self.names[count] != name:
            at = self.names[count] if count < len(self.names) else "nothing"
            order = {"names": "name order", "manifest": "the producer manifest's order"}.get(self.order, "output order")
            raise InputError(str(self.directory / name), f"a saved position names it as shard {count} (from 0) in {order}, but "
                             f"the directory has {at} there: a shard was removed, or added out of order while the consumer was stopped")  # fmt: skip


def _name_order(name: str) -> str:
    """What a shard's name compares by in name order: the name, a shard name's index zero-padded to 20 digits (so
    that ``part-100000.parquet`` sorts after ``part-99999.parquet``, and shard names up to it as their names do)."""
    return f"part-{shard_index(name):020d}.parquet" if is_shard_name(name) else name
