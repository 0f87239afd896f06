"""The lock that gives one run at a time an output directory.

The lock is a file named ``LOCK_NAME`` in the directory, created with O_CREAT | O_EXCL (atomic: of two runs, one
wins) and holding ``<pid> <host>`` of its holder. A lock whose holder is on this host and no longer alive is
stale: it is taken over, with a note on stderr. The lock is removed when the holder ends, on error too.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from etl.errors import OutputError

LOCK_NAME = ".etl.lock"


def _holder(lock: Path) -> tuple[int, str] | None:
    """The (pid, host) written in ``lock``; None when it cannot be read or parsed (or is gone)."""
    try:
        pid, host = lock.read_text().split(maxsplit=1)
        return int(pid), host.strip()
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _create(lock: Path) -> bool:
    """Create ``lock`` holding this process's pid and host; False when it already exists."""
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()} {socket.gethostname()}\n")
    return True


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s lock for the duration of the block; raises OutputError naming the holder when
    another live run holds it."""
    lock = directory / LOCK_NAME
    if not _create(lock):
        holder = _holder(lock)
        if holder is None or holder[1] != socket.gethostname() or _alive(holder[0]):
            who = f"process {holder[0]} on {holder[1]}" if holder else "an unknown process"
            raise OutputError(f"{directory}: in use by {who} (lock file {lock}; remove it if no run is active)")
        print(f"note: {directory}: taking over the stale lock of process {holder[0]} (no longer running)", file=sys.stderr)
        lock.unlink(missing_ok=True)
        if not _create(lock):
            raise OutputError(f"{directory}: in use by another run (lock file {lock})")
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
