"""What the ``etl`` program does once, before its command runs (``prepare``): import the libraries a data command
needs, and leave everything imported out of Python's garbage collection.

Python's cyclic garbage collector goes through every object it tracks at each full collection. numpy, pyarrow,
polars and numba hold some 80,000 of them (modules, classes, functions, their dictionaries), and a command soon
allocates enough objects (numba's first call types its kernels; every row group makes a few thousand) to run full
collections again and again. ``gc.freeze``
moves every object alive at that point, the libraries' modules, classes and functions that live as long as the
process, into a permanent generation that collections skip: about 0.5 s of CPU less per ``etl preprocess`` of 2 M
Criteo rows on 2 cores, and the same output. Only the program's entry point (``etl.cli.main``: ``etl ...``,
``python -m etl ...``) does this, in a process of its own; the command line run from Python (``etl.cli.app``, as
tests do) and a program that imports ``etl`` leave their process's collector alone.
"""

from __future__ import annotations

import gc

#: The commands that read or write data through pipelines: they import etl.pipeline (numba) and etl.io.parquet
#: (pyarrow, polars) in any case.
DATA_COMMANDS = frozenset({"fit", "preprocess", "demo", "bench", "generate"})


def prepare(command: str | None) -> None:
    """Before ``command`` (a subcommand's name; None: none) runs: for a command of ``DATA_COMMANDS`` the imports of
    ``etl.pipeline`` and ``etl.io.parquet``, then a full collection and ``gc.freeze()``: what is alive is frozen,
    never garbage (were ``prepare`` called in a process that ran other work before, a loader dropped in a reference
    cycle, whose threads stop when it is collected, would still be collected; ~50 ms)."""
    if command in DATA_COMMANDS:
        import etl.io.parquet  # noqa: F401
        import etl.pipeline  # noqa: F401
    gc.collect()
    gc.freeze()
