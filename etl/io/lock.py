"""The lock that gives one run at a time an output directory.

The lock is a file named ``LOCK_NAME`` in the directory, holding ``<pid> <host>`` of its holder, on which the
holder keeps an exclusive ``flock`` for as long as it runs. The kernel releases a ``flock`` when its process
ends, however it ends, so the lock of a run that died (kill -9, power loss) is free for the next run, and of two
runs taking over the same leftover file only one gets it. A file whose ``flock`` is free but which names a live
process on this host, or a process on another host (a file system where ``flock`` does not reach the other
host), is still held. The holder removes the file when it ends, on error too.

Object storage (an ``etl.io.fs.Url``) has no such lock: ``locked`` does nothing there, and one run at a time into
an output prefix is up to the user.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from etl.errors import OutputError
from etl.io.fs import Location, Url

LOCK_NAME = ".etl.lock"


def _holder(text: str) -> tuple[int, str] | None:
    """The (pid, host) written in a lock file's ``text``; None when it cannot be parsed."""
    try:
        pid, host = text.split(maxsplit=1)
        return int(pid), host.strip()
    except ValueError:
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


def _in_use(directory: Path, lock: Path, holder: tuple[int, str] | None) -> OutputError:
    who = f"process {holder[0]} on {holder[1]}" if holder else "another run"
    return OutputError(f"{directory}: in use by {who} (lock file {lock}; remove it if no run is active)")


def _acquire(directory: Path, lock: Path) -> int:
    """Open ``lock`` (created if missing, never through a symlink: one there is an ``OutputError``), take its
    ``flock`` and write this process's pid and host into it; returns the descriptor, which holds the lock until
    closed."""
    for _ in range(10):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise OutputError(f"{lock}: a symbolic link where the lock file of {directory} goes; remove it") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _in_use(directory, lock, _holder(os.pread(fd, 4096, 0).decode(errors="replace"))) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock, follow_symlinks=False))
            except FileNotFoundError:
                same = False
            if not same:  # the holder before us removed (or replaced) the file after we opened it: open it again
                os.close(fd)
                continue
            holder = _holder(os.pread(fd, 4096, 0).decode(errors="replace"))
            if holder is not None:
                if holder[1] != socket.gethostname() or _alive(holder[0]):
                    raise _in_use(directory, lock, holder)
                print(f"note: {directory}: taking over the stale lock of process {holder[0]} (no longer running)", file=sys.stderr)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
            return fd
        except BaseException:
            os.close(fd)
            raise
    raise OutputError(f"{directory}: could not take the lock file {lock}: it keeps being replaced")


@contextmanager
def locked(directory: Location) -> Iterator[None]:
    """Hold ``directory``'s lock for the duration of the block; raises OutputError naming the holder when
    another live run holds it. A URL is not locked."""
    if isinstance(directory, Url):
        yield
        return
    lock = directory / LOCK_NAME
    fd = _acquire(directory, lock)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)  # before the flock goes, so no run takes a lock that is then removed
        os.close(fd)
