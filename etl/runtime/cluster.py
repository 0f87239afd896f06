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

from etl.errors import ClusterError, ConfigError

if TYPE_CHECKING:
    from distributed import Client

#: The environment variable that names a scheduler when no spec is given (Dask's own convention).
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"

#: How long a local cluster started by ``connect`` may have no worker process at all before its waiting tasks fail
#: (Dask's ``distributed.scheduler.no-workers-timeout``, when that is not set): far longer than a worker takes to start.
NO_WORKERS_TIMEOUT = "60s"
_NO_WORKERS_KEY = "distributed.scheduler.no-workers-timeout"

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
    reached within ``timeout`` seconds is a ``ConfigError``; a local cluster that fails to start (a worker process
    killed while it starts) is a ``ClusterError``. A local cluster left without any worker process for
    ``NO_WORKERS_TIMEOUT`` fails the tasks waiting for one (``etl.runtime.cluster_tasks`` makes that a
    ``ClusterError``)."""
    spec = cluster_spec(spec)
    if spec is None:
        yield None
        return
    try:
        import dask
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
    # worker processes killed again and again (their Nannies give up restarting them) leave a local cluster without
    # any: its tasks then fail after NO_WORKERS_TIMEOUT (unless Dask's configuration sets that timeout) rather than
    # wait forever for workers that nothing will start
    no_workers = dask.config.get(_NO_WORKERS_KEY) or NO_WORKERS_TIMEOUT
    try:
        with dask.config.set({_NO_WORKERS_KEY: no_workers}):  # read by the scheduler as it starts
            cluster = LocalCluster(n_workers=int(m.group(1)), threads_per_worker=1, processes=True, dashboard_address=None,
                                   scheduler_kwargs={"dashboard_address": ":0"}, preload=[__name__],
                                   silence_logs=logging.CRITICAL)  # fmt: skip
    except Exception as e:  # noqa: BLE001 - Dask's RuntimeError("Nanny failed to start.") and the like, with their cause
        raise ClusterError(f"--cluster {spec}: the local Dask cluster failed to start: {_first_cause(e)} "
                           "(a worker process killed, or out of memory?)") from None  # fmt: skip
    with cluster, Client(cluster) as client:
        yield client


def _first_cause(e: BaseException) -> str:
    """The message of the exception that started the chain ending in ``e`` (Dask wraps a worker's failure to start
    in two RuntimeErrors), its class name when it has none."""
    while e.__cause__ is not None:
        e = e.__cause__
    return str(e) or type(e).__name__


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
