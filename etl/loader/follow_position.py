"""Where a following pass stands in its stream (``FollowPosition``, what ``Loader.state_dict`` saves in follow
mode), the shards it stands on (``PolledShard``), and what is checked of them (``etl.loader.follow``).

A position is untrusted input: ``FollowPosition.from_dict`` checks its form (``ConfigError``), and a pass started
from it checks it against the directory before it delivers a row (``check_start``, ``InputError`` naming the
directory or the shard), since a position that does not fit the shards would deliver some rows twice and others
never:

- the shard it starts in is shard ``before`` (from 0) in arrival order (``Arrivals.check_before``);
- the names of the shards up to it, in arrival order, are the ones it counted (``listing_sha256``): none removed,
  inserted, renamed or moved while the consumer was stopped;
- their footers are the ones it counted (``footers_sha256``, a digest of each shard's footer digest): not another
  directory whose shards have the same names, nor this one made again by a producer that started again at
  ``part-00000`` (a copy of the directory elsewhere, its shards' bytes unchanged, passes);
- ``row`` is within this rank's slice of its shard (``before`` the end of it when its buffer was closed);
- a closed buffer: no longer than ``shuffle_buffer`` (``ConfigError``), its last shard is where it was
  (``end_before``), the shards it spans have their footers (``span_sha256``), and its ``buffer_rows`` end in its
  last shard, as this rank's slices of them hold;
- ``buffer_no`` and ``delivered`` (fewer than ``buffer_rows``) are checked by their form only: the shards do not
  record them.

A position saved before ``listing_sha256`` and ``footers_sha256`` were recorded (both None) is checked for
everything else, and the shards before it are then taken as the directory has them (the digests of the positions
saved after it are made from those). The check reads the footer of every shard up to the position, on the pass's
reader threads (about 1.5 ms a shard of 40 columns and 10 row groups on a local disk: 15 s per 10 000 shards).

While a pass runs, each shard is as its poll found it (``PolledShard``): its footer cut its pieces, and each piece
is read between two checks that the file is still that one (its ``etl.io.fs.identity``, one ``stat`` each, or one
metadata request in object storage; when it changed, its footer is read again and must have the digest polled).
A shard replaced or rewritten after its poll is an ``InputError`` naming it, never rows of another file (a
rewrite in place that keeps the size and sets the modification time back is not seen, as there). The last shard
polled is checked so at each poll: a directory made again under the pass (its last shard gone, or another file)
is refused rather than followed from where the old one was.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow.parquet as pq

from etl.errors import ConfigError, InputError
from etl.io.arrivals import Arrivals
from etl.io.fs import Location, identity
from etl.io.parquet import read_footer
from etl.loader.assembler import PassSettings
from etl.loader.order import RowGroup, row_groups

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FollowPosition:
    """A place in a rank's stream and the state of the shuffle buffer that starts there (see the module docstring
    of ``etl.loader.follow``). ``shard``: the file name of the shard holding the buffer's first row (None before any
    shard, and then every other field has its default), ``before``: how many shards precede it in arrival order,
    ``row``: the row within the shard's slice for this rank; ``buffer_no``: the buffer's number; ``buffer_rows``:
    its length, when it was closed before the position was taken (None: still open, nothing of it delivered);
    ``delivered``: its rows already delivered; ``end_shard`` and ``end_before``: the shard holding the closed
    buffer's last row and how many shards precede it, and ``span_sha256``: a digest of the footers of the shards
    from ``shard`` to ``end_shard`` (all three None without ``buffer_rows``, and in positions saved before they
    were recorded); ``listing_sha256`` and ``footers_sha256``: digests of the names and of the footers of the
    shards up to ``shard`` (included) in arrival order (None in positions saved before they were recorded)."""

    shard: str | None = None
    before: int = 0
    row: int = 0
    buffer_no: int = 0
    buffer_rows: int | None = None
    delivered: int = 0
    end_shard: str | None = None
    end_before: int | None = None
    span_sha256: str | None = None
    listing_sha256: str | None = None
    footers_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Any) -> FollowPosition:
        """The position a ``to_dict`` saved (by this version or an earlier one); ``ConfigError`` for anything else."""
        try:
            pos = cls(**doc)
        except TypeError as e:
            raise ConfigError(f"not a follow-mode loader position: {doc!r} ({e})") from None
        problem = pos._problem()
        if problem is not None:
            raise ConfigError(f"not a follow-mode loader position: {doc!r} ({problem})")
        return pos

    def _problem(self) -> str | None:
        """What no position ``to_dict`` saved can have (None: nothing)."""
        ints = (self.before, self.row, self.buffer_no, self.delivered) + tuple(v for v in (self.buffer_rows, self.end_before) if v is not None)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
            return "counts are integers >= 0"
        if not all(v is None or isinstance(v, str) and v for v in (self.shard, self.end_shard)):
            return "shards are named by their file names"
        if not all(v is None or isinstance(v, str) and _SHA256.fullmatch(v) for v in (self.span_sha256, self.listing_sha256, self.footers_sha256)):
            return "digests are sha256 hex digests"
        if self.shard is None:
            return None if self == FollowPosition() else "a position before any shard has nothing else"
        if (self.listing_sha256 is None) != (self.footers_sha256 is None):
            return "the digests of the shards up to it go together"
        if (self.end_shard is None) != (self.end_before is None) or (self.end_before is not None and self.end_before < self.before):
            return "its buffer's end shard"
        if (self.span_sha256 is not None and self.end_shard is None) or (self.end_shard is not None and self.buffer_rows is None):
            return "the end shard and span of a closed buffer"
        if not self.delivered < (self.buffer_rows if self.buffer_rows is not None else 1):
            return "a buffer with rows left to deliver"
        return None


def footer_digest(footer: pq.FileMetaData) -> str:
    """The sha256 of a Parquet footer as pyarrow serializes it: it changes with the file's row groups, their sizes,
    offsets, row counts and statistics."""
    sink = io.BytesIO()
    footer.write_metadata_file(sink)
    return hashlib.sha256(sink.getvalue()).hexdigest()


def span_digest(footers: Iterable[str]) -> str:
    """One digest of the footer digests of consecutive shards."""
    return hashlib.sha256(" ".join(footers).encode()).hexdigest()


def chained(digest: str | None, item: str) -> str:
    """The digest of a sequence whose digest without its last ``item`` is ``digest`` (None: the empty sequence)."""
    head = bytes.fromhex(digest) if digest is not None else bytes(32)
    return hashlib.sha256(head + hashlib.sha256(item.encode("utf-8", "surrogateescape")).digest()).hexdigest()


@dataclass
class PolledShard:
    """A shard as the poll that took it found it: ``footer_sha256``, the digest of the footer its pieces were cut
    by; ``identity``: the file's (``etl.io.fs.identity``) when it had that footer (None: it changed while the footer
    was read); ``listing_sha256``, ``footers_sha256``: the digests of the names and footers of the shards up to it."""

    path: Location
    footer_sha256: str
    identity: tuple[int, ...] | None
    listing_sha256: str
    footers_sha256: str

    @classmethod
    def poll(cls, path: Location, listing: str | None, footers: str | None, expected: str | None) -> tuple[PolledShard, list[RowGroup]]:
        """The shard at ``path`` and its non-empty row groups; ``listing``, ``footers``: the digests of the names and
        footers of the shards before it in arrival order (None: none); ``expected``: the digest its footer must have
        (a restart checked it; None: any)."""
        seen = _identity(path)
        groups = row_groups([path])
        footer = groups[0].footer if groups and groups[0].footer is not None else read_footer(path)
        digest = footer_digest(footer)
        if expected is not None and digest != expected:
            raise InputError(str(path), _REPLACED)
        same = _identity(path) == seen
        return cls(path, digest, seen if same else None, chained(listing, path.name), chained(footers, digest)), groups

    def check(self) -> None:
        """``InputError`` naming the shard unless its file is still the one polled (a ``stat``; its footer again
        when the file changed)."""
        now = _identity(self.path)
        if now == self.identity:
            return
        if footer_digest(read_footer(self.path)) != self.footer_sha256:
            raise InputError(str(self.path), _REPLACED)
        if _identity(self.path) == now:
            self.identity = now


_REPLACED = ("replaced since it was polled (its footer is not the one it was polled with): a shard must not change once it has arrived "
             "(was the directory made again, or the shard rewritten?)")  # fmt: skip


def _identity(path: Location) -> tuple[int, ...]:
    try:
        return identity(path)
    except FileNotFoundError:
        raise InputError(str(path), "gone since it was polled: a shard must stay once it has arrived (was the directory made again?)") from None
    except OSError as e:
        raise InputError(str(path), f"cannot stat: {e.strerror or e}") from None


@dataclass(frozen=True)
class Resumed:
    """What a restart's check of its position found: the digests of the names and footers of the shards before
    the position's shard (None: none), and the footer digest of each shard from it to its buffer's end, by arrival
    index, which their polls must find again."""

    listing_sha256: str | None
    footers_sha256: str | None
    footers: dict[int, str]


def check_start(start: FollowPosition, arrivals: Arrivals, settings: PassSettings, pool: Executor) -> Resumed:
    """Check ``start`` against the shards ``arrivals`` has polled (see the module docstring); ``pool`` reads their
    footers. ``InputError`` naming the directory or a shard, ``ConfigError`` for a buffer longer than
    ``shuffle_buffer``."""
    arrivals.check_before(start.before, start.shard)
    if start.shard is None:
        return Resumed(None, None, {})
    directory, before = arrivals.directory, start.before
    end = start.end_before if start.end_before is not None else before
    if start.end_shard is not None:
        arrivals.check_before(end, start.end_shard)
    names = arrivals.names[: end + 1]
    listing = _chain(names[:before])
    if start.listing_sha256 is not None and chained(listing, names[before]) != start.listing_sha256:
        raise InputError(str(directory), f"the {before + 1} shard(s) up to {start.shard} are not the ones the saved position counted, "
                         "in that order: one was removed, inserted, renamed or moved while the consumer was stopped")  # fmt: skip
    digests = list(pool.map(lambda name: footer_digest(read_footer(directory / name)), names[:before]))
    spanned = list(pool.map(lambda name: read_footer(directory / name), names[before:]))
    spanned_digests = [footer_digest(f) for f in spanned]
    footers = _chain(digests)
    if start.footers_sha256 is not None and chained(footers, spanned_digests[0]) != start.footers_sha256:
        raise InputError(str(directory), f"the {before + 1} shard(s) up to {start.shard} have the names the saved position counted, "
                         "but not their contents (their footers differ): the state of another directory, or of this one before it was "
                         "made again or a shard replaced")  # fmt: skip
    slices = [_slice_rows(f.num_rows, settings) for f in spanned]
    if not (start.row < slices[0] if start.buffer_rows is not None else start.row <= slices[0]):
        raise InputError(str(directory / start.shard), f"a saved position starts at row {start.row} of this rank's {slices[0]} rows of "
                         f"it (rank {settings.rank} of {settings.world_size})")  # fmt: skip
    if start.buffer_rows is not None:
        _check_buffer(start, start.buffer_rows, settings, slices, spanned_digests, str(directory))
    return Resumed(listing, footers, dict(enumerate(spanned_digests, before)))


def _check_buffer(start: FollowPosition, rows: int, settings: PassSettings, slices: list[int], digests: list[str], directory: str) -> None:
    """The checks of the position of a closed buffer of ``rows`` rows (see the module docstring); ``slices``: this
    rank's rows of each shard from ``start.shard`` to its end shard, ``digests`` their footers'."""
    if rows > settings.shuffle_buffer:
        raise ConfigError(f"a saved follow-mode position has a buffer of {rows} rows, more than shuffle_buffer={settings.shuffle_buffer}")
    if start.end_shard is None:  # saved before end shards were recorded
        return
    if start.span_sha256 is not None and span_digest(digests) != start.span_sha256:
        raise InputError(directory, f"the shards {start.shard} to {start.end_shard}, which hold the rows of the buffer a saved position "
                         "partly delivered, are not as they were when it was saved (one was replaced while the consumer was stopped): "
                         "its rows cannot be delivered exactly once")  # fmt: skip
    through = sum(slices) - start.row
    ahead = through - slices[-1] if len(slices) > 1 else 0
    if not ahead < rows <= through:
        raise InputError(directory, f"a saved position's buffer of {rows} rows from row {start.row} of {start.shard} does not end in "
                         f"{start.end_shard}: a buffer from there that ends in it holds {ahead + 1} to {through} of this rank's rows")  # fmt: skip


def _chain(items: Sequence[str]) -> str | None:
    """The ``chained`` digest of ``items``."""
    digest = None
    for item in items:
        digest = chained(digest, item)
    return digest


def _slice_rows(num_rows: int, settings: PassSettings) -> int:
    """The rows of a shard of ``num_rows`` rows that rank ``settings.rank`` takes (``etl.loader.order``)."""
    rank, world = settings.rank, settings.world_size
    return (rank + 1) * num_rows // world - rank * num_rows // world

