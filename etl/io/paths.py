"""Input paths as users name them: files, directories, and glob patterns, local or in object storage.

Every command-line option that takes several paths, and ``etl.io.parquet.list_shards`` (hence the ``Loader``),
expand them with ``expand_globs``, so ``'data/*.parquet'`` (quoted, so that the shell leaves it alone) names the
same files everywhere, and ``'s3://bucket/raw/*.parquet'`` the same objects (see ``etl.io.fs`` for URLs).
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from etl.errors import InputError
from etl.io.fs import Location, Url, location

_MAGIC = frozenset("*?[")


def expand_globs(items: Sequence[str | Path | Url], storage_options: dict[str, Any] | None = None) -> list[Location]:
    """``items`` in order, each made a location (``etl.io.fs.location``, with ``storage_options`` for URLs) and each
    glob pattern (``*``, ``?``, ``[...]``; ``**`` spans directories) replaced by the paths it matches, sorted by
    name. An item that exists as named is kept as is, even if its name holds a pattern character; any other item
    without a pattern character is kept too (whoever opens it reports it missing). Raises ``InputError`` naming a
    pattern that matches nothing."""
    out: list[Location] = []
    for item in items:
        where = location(item, storage_options)
        text = str(where)
        if not _MAGIC.intersection(text) or where.exists():
            out.append(where)
            continue
        matches = _matches(where)
        if not matches:
            raise InputError(text, "no file or directory matches this pattern")
        out.extend(matches)
    return out


def _matches(pattern: Location) -> list[Location]:
    """What the glob ``pattern`` matches, sorted by name."""
    if isinstance(pattern, Path):
        return [Path(m) for m in sorted(glob.glob(str(pattern), recursive=True))]
    parent = pattern.parent
    while _MAGIC.intersection(parent.key):  # glob from the first directory without a pattern character
        parent = parent.parent
    return sorted(parent.glob(pattern.key[len(parent.key) + 1 :]), key=str)
