"""Where distributed work runs: a Dask cluster named by a spec string.

``--cluster`` (and ``connect``) accept:

- ``local:N``: a ``LocalCluster`` of N worker processes on this machine, one thread each, started for the run and
  stopped when it ends (``N`` >= 1; the workers leave Ctrl-C to the process that started them, see ``dask_setup``);
- ``tcp://HOST:PORT`` (any address a Dask scheduler listens on, e.g. ``tls://``): an existing cluster, left
  running when the run ends.

Without a spec, the ``DASK_SCHEDULER_ADDRESS`` environment variable names the scheduler when it is set; otherwise
work runs in this process's threads (``connect`` yields None). Dask is imported only here and only when a cluster
is asked for: it is the optional ``dist`` extra.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from etl.errors import ConfigError

if TYPE_CHECKING:
    from distributed import Client

#: The environment variable that names a scheduler when no spec is given (Dask's own convention).
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"

_LOCAL = re.compile(r"local:(\d+)")
_ADDRESS = re.compile(r"[a-z][a-z0-9+.-]*://\S+")


def cluster_spec(spec: str | None) -> str | None:
    """The spec to use: ``spec`` itself when given, else ``DASK_SCHEDULER_ADDRESS`` when set, else None (threads).
    Raises ``ConfigError`` naming the spec when it is neither ``local:N`` (N >= 1) nor a scheduler address."""
    if spec is None:
        spec = os.environ.get(SCHEDULER_ENV) or None
        if spec is None:
            return None
    m = _LOCAL.fullmatch(spec)
    if m is not None and int(m.group(1)) >= 1:
        return spec
    if m is None and _ADDRESS.fullmatch(spec):
        return spec
    raise ConfigError(f"--cluster '{spec}': expected local:N (N >= 1 worker processes) or a scheduler address such as tcp://HOST:PORT")


@contextlib.contextmanager
def connect(spec: str | None, timeout: float = 30.0) -> Iterator[Client | None]:
    """A Dask client for ``spec`` (see ``cluster_spec``), or None to run in threads. A local cluster started here is
    closed on exit, whatever ends the block; an existing cluster is only disconnected from. A scheduler not
    reached within ``timeout`` seconds is a ``ConfigError``."""
    spec = cluster_spec(spec)
    if spec is None:
        yield None
        return
    try:
        from distributed import Client, LocalCluster
    except ImportError as e:
        raise ConfigError(f"--cluster {spec}: Dask is not installed (pip install 'etl[dist]')") from e
    m = _LOCAL.fullmatch(spec)
    if m is None:
        try:
            client = Client(spec, timeout=timeout)
        except OSError as e:
            raise ConfigError(f"--cluster {spec}: cannot reach the scheduler ({e})") from e
        with client:
            yield client
        return
    # no dashboard; the scheduler's HTTP endpoint on a free port (its default, 8787, warns on stderr when taken);
    # the cluster's own log lines (a worker that loses the scheduler while the run stops, ...) stay off the terminal:
    # what goes wrong in a task reaches the client as an exception, user errors as one line
    with LocalCluster(n_workers=int(m.group(1)), threads_per_worker=1, processes=True, dashboard_address=None,
                      scheduler_kwargs={"dashboard_address": ":0"}, preload=[__name__],
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:  # fmt: skip
        yield client


@contextlib.contextmanager
def connecting(spec: str | None, timeout: float = 30.0) -> Iterator[Callable[[], Client | None]]:
    """``connect(spec, timeout)`` in a thread of its own, so that a local cluster starts (its worker processes
    importing Python and etl) while the calling thread goes on reading the pipeline and listing shards: yields a
    function that waits for the start to end and returns the client (None without a cluster), or raises what the
    start raised. A bad spec raises ``ConfigError`` here, at once. That thread owns the client and the cluster: on
    exit, whatever ends the block, it is told to close them, as ``connect`` does, and waited for."""
    if cluster_spec(spec) is None:
        yield lambda: None
        return
    started: list[Client | None] = []
    failed: list[BaseException] = []
    ready, done = threading.Event(), threading.Event()

    def own() -> None:
        try:
            with connect(spec, timeout) as client:
                started.append(client)
                ready.set()
                done.wait()
        except BaseException as e:  # raised in the calling thread: by client() or on exit
            failed.append(e)
        finally:
            ready.set()

    def client() -> Client | None:
        ready.wait()
        if not started:
            raise failed[0]
        return started[0]

    thread = threading.Thread(target=own, name="etl-cluster")
    thread.start()
    try:
        yield client
    finally:
        done.set()
        thread.join()
    if started and failed:  # the cluster failed to close
        raise failed[0]


def dask_setup(worker: object) -> None:
    """Run by each worker process of a local cluster that ``connect`` starts (a Dask preload, restarted workers
    included): it leaves the terminal's foreground process group (a session of its own) and ignores SIGINT, so that
    Ctrl-C in a terminal interrupts the ``etl`` process alone; that one stops the tasks and then the cluster. Leaving
    the group is what counts: polars answers SIGINT itself, with a KeyboardInterrupt inside a running query,
    whatever Python's handler is. The worker still stops with the ``etl`` process (Dask ties it to its parent).

    It then imports what etl's tasks run (``etl.preprocess.tasks``: the pipeline, its ops, Parquet and Arrow), while
    the cluster is starting, rather than in the worker's first task."""
    with contextlib.suppress(OSError):  # already a session leader
        os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import etl.preprocess.tasks  # noqa: F401
