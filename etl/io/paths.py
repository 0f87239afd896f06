"""Input paths as users name them: files, directories, and glob patterns.

Every command-line option that takes several paths, and ``etl.io.parquet.list_shards`` (hence the ``Loader``),
expand them with ``expand_globs``, so ``'data/*.parquet'`` (quoted, so that the shell leaves it alone) names the
same files everywhere.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

from etl.errors import InputError

_MAGIC = frozenset("*?[")


def expand_globs(items: Sequence[str | Path]) -> list[Path]:
    """``items`` in order, each glob pattern (``*``, ``?``, ``[...]``; ``**`` spans directories) replaced by the
    paths it matches, sorted by name. An item that exists as named is kept as is, even if its name holds a
    pattern character; any other item without a pattern character is kept too (whoever opens it reports it
    missing). Raises ``InputError`` naming a pattern that matches nothing."""
    out: list[Path] = []
    for item in items:
        text = str(item)
        if not _MAGIC.intersection(text) or Path(text).exists():
            out.append(Path(item))
            continue
        matches = sorted(glob.glob(text, recursive=True))
        if not matches:
            raise InputError(text, "no file or directory matches this pattern")
        out.extend(Path(m) for m in matches)
    return out
