"""How long-running jobs report progress.

A job that makes several passes over its input (``etl.pipeline.fit``: one per fitting stage; ``etl.preprocess``:
fit, then transform) reports each pass by name, so that every row is counted once per pass. A ``Progress`` is
called as ``progress(name, rows)`` after each piece of work (a row group, usually), with the name of the pass
and the number of input rows the piece covered. Pass names: ``"fit"`` (``"fit 1/2"``, ``"fit 2/2"``... when the
ops are fitted in several stages), on a Dask cluster ``"fit merge"`` (``"fit 1/2 merge"``...: the merge of the
count tables' partitions, ``etl.pipeline.distributed``), and ``"transform"``. Calls may come from several threads
at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

Progress: TypeAlias = Callable[[str, int], None]

