"""Process-wide tuning of the C allocator (glibc's malloc) for batch processing.

Transforming a row group allocates large arrays (keys, ids, float columns) that are freed soon after, row group
after row group. ``tune_allocator`` makes malloc keep that memory for the next row group instead of returning it
to the operating system each time. It changes the whole process, so nothing calls it on import: the command line
and ``etl.Loader`` call it, and a program that drives ``Pipeline`` itself may call it once at start.
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt parameters, from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_tuned = False  # set once this process's allocator has been tuned


def tune_allocator() -> None:
    """Make glibc's malloc keep freed memory for reuse instead of handing it back to the OS after every row group.

    With glibc's defaults, blocks of 128 KiB and more are mmap'ed and unmapped again when freed (or trimmed off the
    top of the heap), so each fresh array page-faults its memory in again. This sets, for the whole process:

    - ``M_MMAP_THRESHOLD`` to 32 MiB (the largest value glibc accepts): smaller blocks come from the heap;
    - ``M_TRIM_THRESHOLD`` to 1 GiB: free memory at the top of the heap is kept until there is more than that;
    - ``M_TOP_PAD`` to 64 MiB: the heap grows by at least that much at a time.

    Peak memory is unchanged; memory freed after a peak stays with the process for reuse. (Setting these also
    turns off glibc's dynamic adjustment of the mmap threshold.)

    Does nothing when the environment sets ``ETL_MALLOC_TUNING=0``, on systems other than Linux, or when the C
    library has no ``mallopt`` (musl, ...). Idempotent: once the allocator is tuned, later calls return at once."""
    global _tuned
    if _tuned or os.environ.get("ETL_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    mallopt(_M_TOP_PAD, 64 << 20)
    _tuned = True
