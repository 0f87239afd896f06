"""The shards of a directory that a producer keeps filling, in arrival order (follow mode).

Arrival order is name order: a producer names its shards so that each new one sorts after every earlier one
(``part-00000.parquet``, ``part-00001.parquet``, ... or a zero-padded timestamp). A shard counts once it is
complete, which the producer signals by writing it under a temporary name that does not end in ``.parquet``
(``etl.io.files.temporary_path`` makes one) and renaming it onto its final name (in object storage, the object
appears whole once its upload or copy completes). The entries ``etl.io.parquet.list_shards`` takes from a
directory are the candidates: ``*.parquet`` regular files, no temporaries, no subdirectories.

A shard that appears with a name sorting before a shard already seen broke the rule: it would land in the middle of
rows already delivered, so ``Arrivals.poll`` raises ``InputError`` naming it rather than skip it or deliver it out
of order. Shards are never expected to disappear: a consumer that restarts from a saved position finds the shards
before it by counting them (``Arrivals.check_before``).
"""

from __future__ import annotations

from etl.errors import InputError
from etl.io.files import is_temporary
from etl.io.fs import Location


class Arrivals:
    """The complete shards of ``directory`` in arrival order: ``poll`` returns those that arrived since the previous
    call (all of them, on the first)."""

    def __init__(self, directory: Location):
        self.directory = directory
        self.names: list[str] = []  # every shard seen, in arrival order
        self._seen: set[str] = set()

    def poll(self) -> list[Location]:
        """The shards that appeared since the last poll, in name order. ``InputError`` for a directory that cannot
        be listed, and for a new shard whose name sorts before one seen earlier (it arrived out of order)."""
        try:
            found = sorted(p.name for p in self.directory.glob("*.parquet") if not is_temporary(p.name) and p.name not in self._seen)
            new = [name for name in found if not (self.directory / name).is_dir()]
        except OSError as e:
            raise InputError(str(self.directory), f"cannot list: {e}") from None
        if new and self.names and new[0] < self.names[-1]:
            raise InputError(str(self.directory / new[0]), f"arrived after {self.names[-1]} although its name sorts before it: shards must "
                             "arrive in name order (write each one under a temporary name and rename it once complete)")  # fmt: skip
        self.names.extend(new)
        self._seen.update(new)
        return [self.directory / name for name in new]

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
            raise InputError(str(self.directory / name), f"a saved position names it as shard {count} (from 0) in name order, but the directory "
                             f"has {at} there: a shard was removed, or added out of order while the consumer was stopped")  # fmt: skip
