"""Follow mode: a pass that never ends, over the shards of a directory as they arrive (``Loader(follow=True)``).

Rows: the shards are taken in arrival order (``etl.io.arrivals``: name order, or the order a producer's manifest
lists them in; each shard once it is complete), the ones present at start first. Each shard's rows are split between
ranks by the rule of ``etl.loader.order`` applied to that shard alone (rank ``r`` of ``w`` takes rows
``[r * N // w, (r + 1) * N // w)`` of its ``N``), so every rank gets its share of every shard and the ranks' row
counts differ by at most one per shard. A rank's rows, in arrival order, form its stream.

Batches: the stream fills shuffle buffers of ``shuffle_buffer`` rows, each permuted (with ``shuffle``) by a
generator drawn from (seed, rank, buffer number), and batches are cut from them as in ``etl.loader.assembler``: a
row is delivered at most ``shuffle_buffer`` rows away from its place in arrival order. When no shard has arrived
for ``idle_flush`` seconds and every known row is buffered, the buffer being filled is closed as it is (shorter)
and its rows are delivered: in full batches, and, without ``drop_last``, a short last one. With ``drop_last`` the
buffer is closed only when that lets a batch out; otherwise its rows wait there for the next shard's (closing it
would not deliver them, and short buffers would pile up). The pass ends only when it is closed.

Streaming states (online vocabularies, Categorify ``online: true``): the assembler gives values to each batch's rows
in its row order as it gathers the batch, as an epoch's assembler does (``etl.loader.stream_state``), and the state
saved with a position is the state after the batch that position follows (a restart continues from there: the same
ids and events for the batches an uninterrupted run with the same batches would deliver).

Position (``etl.loader.follow_position.FollowPosition``, what ``Loader.state_dict`` saves in follow mode): the
first buffer not yet wholly delivered, given by where its rows start in the stream (the shard, how many shards
came before it, the row within the shard's slice), its number, its length when it was already closed (a buffer
closed early by an idle flush is shorter), the shard holding its last row and a digest of the footers of the
shards it spans when it was closed, how many of its rows were delivered, and digests of the names and of the
footers of the shards up to it in arrival order. A pass started from a position rebuilds that buffer, the same
rows in the same permutation, drops the rows already delivered and goes on: every row of the stream is delivered
exactly once across any number of restarts, provided each restart starts from the position saved with the last
batch the training counted. Before it delivers a row, the restart checks the position against the shards
(``etl.loader.follow_position.check_start``): the shards up to it are the ones it counted, in the same order, with
the same footers (none removed, inserted, moved or replaced while the consumer was stopped; not another
directory, nor this one made again by a producer that started again at ``part-00000``; a copy of the directory
elsewhere passes), its row is within its shard, and its buffer ends in the shard it ended in and spans shards with
the footers they had. Each breach is an ``InputError`` naming the directory or the shard, since a buffer rebuilt
from other rows would deliver some rows twice and others never. A position saved before the digests of the
shards up to it were recorded is checked for the rest. Where later buffers end may differ from the run before
(idle flushes depend on time); which rows come out does not.

Shards that change: a shard's footer, read at its poll, cuts its pieces, and each piece of a raw shard is read
between two checks that the file is still the one polled (``etl.loader.follow_position.PolledShard``: a ``stat``
each, the footer again when the file changed); at each poll, the last shard polled is checked so. A shard
replaced or rewritten after its poll, or a directory made again under the pass, is an ``InputError`` naming the
shard, never rows of another file delivered. (The files of a processed output are checked by its reader against
the manifest entries they were counted with, ``etl.io.arrivals.CountedFiles``.)

Ranks: each rank polls the directory on its own and waits, in its poll loop, for the next shard; a rank that sees
a shard later (or reads it more slowly) delivers its rows later, and in distributed training the collectives of the
training step make the other ranks wait for it. Idle flushes follow each rank's own clock, so with
``world_size > 1`` a quiet stream may give ranks different numbers of short batches: use ``drop_last=True`` there
(only full batches, so the ranks' batch counts differ only by what has not arrived yet) or a long ``idle_flush``.

Memory does not grow with the stream: the buffers, their positions (``closed``) and the streaming states' undo
records (``etl.loader.stream_state``) are those between the consumer and the assembler (bounded by the ring and the
read-ahead), the pieces read ahead are ``num_workers + prefetch``, and the known shards not yet read hold a few
objects a row group and their ``PolledShard`` (``shards``, kept from the buffer being filled on; at start, those of
every shard present from the start position's on). What grows with the shards seen is ``Arrivals``' record of
their names (about 120 bytes a shard with names like ``part-00000.parquet``: 12 MB per 100 000 shards), as each
poll's listing of the directory (or reading of the producer's manifest, which lists every shard) does; following
the output of ``etl preprocess``, also the manifest entry each file was counted with
(``etl.io.arrivals.CountedFiles``), as its manifest.json holds. A restart reads the footer of every shard up to its
position once (``check_start``), on the reader threads.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from etl.errors import ConfigError
from etl.io.arrivals import PROCESSED, Arrivals, CountedFiles, check_order
from etl.io.fs import Location
from etl.loader.assembler import Assembler, Item, PassSettings, pieces_from
from etl.loader.chunk import Chunk
from etl.loader.epoch import Slots, assemble, next_item, shutdown
from etl.loader.follow_position import FollowPosition, PolledShard, check_start, span_digest
from etl.loader.order import Piece, rank_pieces
from etl.loader.ring import Ring
from etl.loader.stats import LoaderStats
from etl.loader.stream_state import StreamPass


@dataclass(frozen=True)
class FollowSettings:
    """How a following pass polls: ``poll_interval`` seconds between listings of the directory; ``idle_flush``
    seconds without a new shard before the buffered rows are delivered; ``drop_last``: no short batches;
    ``arrivals``: the arrival order (``etl.io.arrivals.ORDERS``, or ``PROCESSED``); ``artifacts_sha256``: for a
    processed output, the checksum of the artifacts the loader opened, which its files must have been made with."""

    poll_interval: float
    idle_flush: float
    drop_last: bool
    arrivals: str = "names"
    artifacts_sha256: str | None = None

    @classmethod
    def of(cls, poll_interval: float, idle_flush: float | None, drop_last: bool, arrivals: str) -> FollowSettings:
        """The settings of ``Loader(follow=True, ...)``'s keywords (``idle_flush`` None: ``poll_interval``);
        ``ConfigError`` for values that cannot work."""
        check_order(arrivals)
        if not poll_interval > 0 or (idle_flush is not None and not idle_flush >= 0):
            raise ConfigError(f"poll_interval must be > 0 and idle_flush >= 0, got poll_interval={poll_interval}, idle_flush={idle_flush}")
        return cls(poll_interval, poll_interval if idle_flush is None else idle_flush, drop_last, arrivals)


#: Where rows start in a rank's stream: (shards before, shard name, row within the shard's slice).
_At = tuple[int, str | None, int]

#: A batch as a following pass queues it: the assembler's item and the position after it.
FollowItem = tuple[Item, FollowPosition]


class FollowAssembler(Assembler):
    """The assembler of a following pass (see the module docstring): ``batches`` polls ``arrivals`` for shards,
    reads their pieces on the pool, and yields ``FollowItem``s, forever (until ``stop``). ``streams``: the pass's
    use of the loader's streaming states, started at ``start``'s buffer (``etl.loader.stream_state``)."""

    def __init__(self, settings: PassSettings, follow: FollowSettings, arrivals: Arrivals, start: FollowPosition,
                 read: Callable[[Piece], Chunk], pool: ThreadPoolExecutor, ring: Ring, stats: LoaderStats, *,
                 read_ahead: int, stop: threading.Event, empty: Chunk, streams: StreamPass | None = None) -> None:  # fmt: skip
        super().__init__(settings, [], read, pool, ring, stats, read_ahead=read_ahead, stop=stop,
                         all_submitted=threading.Event(), empty=empty, streams=streams)  # fmt: skip
        self.follow, self.arrivals, self.start = follow, arrivals, start
        self.buffer_no, self.skip = start.buffer_no, start.delivered
        self.limit = start.buffer_rows  # the length of the first buffer, when the position fixed it
        self.next_at: _At = (start.before, start.shard, start.row)  # where the next row fed comes from
        self.filling_at: _At = self.next_at  # where the buffer being filled starts
        self.closed: deque[tuple[FollowPosition, int]] = deque()  # the position (nothing delivered) and rows of each buffer in self.stream
        self.shards: dict[int, PolledShard] = {}  # each shard from the one the buffer being filled starts in on, by arrival index
        self.last: PolledShard | None = None  # the last shard polled
        self.so_far: tuple[str | None, str | None] = (None, None)  # the digests of the names and footers of the shards polled so far
        self.expected: dict[int, str] = {}  # the footer digests a restart checked, by arrival index, which the polls must find again
        self.watch = arrivals.order != PROCESSED  # raw shards: each piece read is checked against its shard's poll

    def batches(self) -> Generator[FollowItem, None, None]:  # type: ignore[override]
        """The stream's batches, each with the position after it; ends only once ``stop`` is set."""
        f = self.follow
        pending: deque[tuple[Piece, _At, PolledShard]] = deque()  # pieces of known shards not yet submitted
        window: deque[tuple[Future, _At]] = deque()
        next_poll = last_arrival = time.monotonic()
        flushed = True  # nothing buffered has arrived since the last idle flush
        first = True
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_poll:
                for index, path in self._arrived(first):
                    pending.extend(self._shard_pieces(index, path))
                    last_arrival, flushed = now, False
                first, next_poll = False, now + f.poll_interval
            while pending and len(window) < self.read_ahead:
                piece, at, shard = pending.popleft()
                window.append((self.pool.submit(self._read, piece, shard) if self.watch else self.pool.submit(self.read, piece), at))
            if window:
                future, at = window.popleft()
                self._feed(future.result(), at)
                yield from self._emit_full()
                continue
            if not flushed and now - last_arrival >= f.idle_flush:
                flushed = True
                yield from self._emit_idle()
                continue
            wake = next_poll if flushed else min(next_poll, last_arrival + f.idle_flush)
            self.stop.wait(max(0.0, wake - time.monotonic()))

    def _arrived(self, first: bool) -> list[tuple[int, Location]]:
        """The shards that arrived since the last poll with their index in arrival order; on the first poll, those
        from the start position's shard on (the ones before it were delivered before the restart), after checking
        the start position against the shards (``check_start``); on the others, after checking that the last shard
        polled before is still the file it was (raw shards)."""
        before = len(self.arrivals.names)
        new = self.arrivals.poll()
        if first:
            resumed = check_start(self.start, self.arrivals, self.settings, self.pool)
            self.so_far, self.expected = (resumed.listing_sha256, resumed.footers_sha256), resumed.footers
        elif self.watch and self.last is not None:
            self.last.check()
        return [(before + k, path) for k, path in enumerate(new) if before + k >= self.start.before]

    def _shard_pieces(self, index: int, path: Location) -> list[tuple[Piece, _At, PolledShard]]:
        """The pieces of this rank's slice of a shard, each with where it starts in the stream (from the start
        position's row on, for the start position's shard) and the shard as polled (``PolledShard``)."""
        s = self.settings
        shard, groups = PolledShard.poll(path, *self.so_far, self.expected.pop(index, None))
        self.shards[index] = self.last = shard
        self.so_far = shard.listing_sha256, shard.footers_sha256
        pieces = rank_pieces(groups, seed=s.seed, epoch=0, shuffle=False, rank=s.rank, world_size=s.world_size)
        row = self.start.row if index == self.start.before else 0
        out: list[tuple[Piece, _At, PolledShard]] = []
        for piece in pieces_from(pieces, row):
            out.append((piece, (index, path.name, row), shard))
            row += piece.length
        return out

    def _read(self, piece: Piece, shard: PolledShard) -> Chunk:
        """The chunk of ``piece``, read between two checks that its shard is the file polled (``InputError`` naming
        it otherwise), so that its rows come from that file."""
        shard.check()
        chunk = self.read(piece)
        shard.check()
        return chunk

    def _feed(self, chunk: Chunk, at: _At) -> None:
        """Append a chunk that starts at ``at`` to the shuffle buffers, closing each one that fills up."""
        index, name, row = at
        while chunk.n:
            if not self.filled:
                self.filling_at = (index, name, row)
            size = self.limit or self.settings.shuffle_buffer
            take = min(chunk.n, size - self.filled)
            self.next_at = (index, name, row + take)  # where the buffer ends, if these rows fill it
            self._buffer(chunk.slice(0, take))
            chunk, row = chunk.slice(take, chunk.n), row + take
            if self.filled == size:  # a first buffer of a fixed length shorter than shuffle_buffer
                self._flush()

    def _flush(self) -> None:
        """Close the buffer being filled; it ends where the rows fed so far end (``next_at``)."""
        (first, shard, row), (last, end_shard, _) = self.filling_at, self.next_at
        span = span_digest(self.shards[i].footer_sha256 for i in range(first, last + 1))
        upto = self.shards[first]
        position = FollowPosition(shard, first, row, self.buffer_no, self.filled, 0, end_shard, last, span, upto.listing_sha256, upto.footers_sha256)
        self.closed.append((position, self.filled))
        while self.shards and (oldest := next(iter(self.shards))) < last:  # the next buffer starts in shard ``last`` or after
            del self.shards[oldest]  # (shards are recorded in arrival order)
        self.limit = None
        super()._flush()

    def _emit_full(self) -> Generator[FollowItem, None, None]:
        while self._available() >= self.settings.batch_size:
            item = self._emit(self.settings.batch_size)
            if item is None:
                return
            yield self._with_position(item)

    def _emit_idle(self) -> Generator[FollowItem, None, None]:
        """Close the buffer being filled and deliver what the buffers hold (a short batch only without
        ``drop_last``). With ``drop_last``, the buffer is closed only when that lets a batch out: otherwise its
        rows could not leave anyway, and they wait there for the next shard's."""
        if self.follow.drop_last and self._available() + self.filled < self.settings.batch_size:
            return
        if self.filled:
            self._flush()
        yield from self._emit_full()
        if self._available() and not self.follow.drop_last:
            item = self._emit(self._available())
            if item is not None:
                yield self._with_position(item)

    def _with_position(self, item: Item) -> FollowItem:
        """``item`` and the position after it."""
        return item, self._position_key()

    def _position_key(self) -> FollowPosition:
        """The position after the batches emitted so far: the first buffer with rows not yet delivered."""
        while len(self.closed) > len(self.stream):
            self.closed.popleft()
        if self.stream:
            position, rows = self.closed[0]
            return replace(position, delivered=rows - len(self.stream[0][1]))
        before, shard, row = self.filling_at if self.filled else self.next_at
        upto = self.shards[before]  # polled: rows of it were fed
        return FollowPosition(shard, before, row, self.buffer_no, listing_sha256=upto.listing_sha256, footers_sha256=upto.footers_sha256)


class FollowPass:
    """A following pass: an assembler thread (``FollowAssembler``) and ``num_workers`` reader threads, with the
    interface of ``etl.loader.epoch.EpochPass`` (``take``, ``release``, ``close``; its ``settings.total`` is
    unbounded). ``take`` also records the position after the batch in ``cursor`` (the loader's, which
    ``state_dict`` reads). ``counted``: following a processed output, where its polls record the entries of the
    files they count (the loader's, which its reader checks the files against). Like an epoch pass, it stops its
    threads when closed or garbage-collected."""

    def __init__(self, settings: PassSettings, follow: FollowSettings, directory: Location, start: FollowPosition,
                 read: Callable[[Piece], Chunk], ring: Ring, stats: LoaderStats, cursor: FollowCursor, *,
                 num_workers: int, prefetch: int, empty: Chunk, io_bound: bool = False, streams: StreamPass | None = None,
                 counted: CountedFiles | None = None) -> None:  # fmt: skip
        self.settings, self.epoch, self.ring, self.cursor = settings, settings.epoch, ring, cursor
        self.all_submitted = threading.Event()  # never set: a following pass always has more to read
        self.assembled = threading.Event()
        self.stop = threading.Event()
        self.ready: queue.Queue = queue.Queue(maxsize=prefetch + 1)
        self.pool = ThreadPoolExecutor(num_workers + prefetch if io_bound else num_workers, thread_name_prefix="etl-loader")
        arrivals = Arrivals(directory, follow.arrivals, follow.artifacts_sha256, counted)
        assembler = FollowAssembler(settings, follow, arrivals, start, read, self.pool, ring, stats, read_ahead=num_workers + prefetch,
                                    stop=self.stop, empty=empty, streams=streams)  # fmt: skip
        self.thread = threading.Thread(target=assemble, args=(assembler, self.ready, self.assembled), daemon=True, name="etl-follow")
        self.thread.start()
        self._slots = Slots(ring, self.ready)
        self._finalizer = weakref.finalize(self, shutdown, self.stop, self.pool, self.thread, self._slots, self.assembled)

    def take(self) -> Item | None:
        """The next batch, waiting for it as long as it takes; None once the pass is closed (the only way it ends,
        usually from another thread); the error that stopped the pass is raised instead."""
        item = next_item(self.ready, self.thread, "follow", self.stop)
        if item is None:
            return None
        if isinstance(item, BaseException):
            self.close()
            raise item
        batch, position = item
        self._slots.held = batch.slot
        self.cursor.position = position
        return batch

    def release(self) -> None:
        self._slots.release_held()

    def close(self) -> None:
        self._finalizer()


class FollowCursor:
    """The position after the last batch a following loader handed out (where a restart continues)."""

    def __init__(self, position: FollowPosition):
        self.position = position
