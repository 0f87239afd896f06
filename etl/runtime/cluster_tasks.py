"""Work as tasks on a Dask cluster: the counterpart of ``etl.runtime.workers.run_workers`` for ``--cluster``, and the one
way the package runs tasks there (``etl.preprocess``: a task per shard; ``etl.pipeline.distributed``: counting
and merging tasks of the fit).

The calling process (the driver) submits one task per item and handles each result in its own thread as the task
completes, so whatever the results feed (a manifest, the fitted state) has one owner. A task whose worker process
dies is run again by Dask on another worker; the work must therefore be safe to repeat (write under unique
temporary names and let the driver commit). Each task gets:

- ``stop``: set by the driver when another task failed or the driver is interrupted; long-running work checks it
  between steps (a Dask ``Event`` of this run, read on the scheduler) and returns;
- ``progress(n)``: counts ``n`` more rows done; the counts travel as Dask events, and with the result, and the
  driver reports each item's rows once, even when its task ran twice (it keeps the largest count seen per item).

The first error of a task (an ``EtlError`` such as ``RowError`` travels with its message and fields) is raised in
the driver after the other tasks were told to stop and have ended, or ``STOP_GRACE`` seconds have passed. So is a
``ClusterError`` naming the item when the worker processes holding its task (running it, or with it queued)
died more often than Dask allows (its ``distributed.scheduler.allowed-failures`` setting: killed, out of memory), or
when Dask forgot it because the worker processes holding its inputs (``shared``: what ``share`` sent them) all died,
or when no worker process was left to run it for the scheduler's ``distributed.scheduler.no-workers-timeout`` (which
``etl.runtime.cluster.connect`` sets for the local clusters it starts). ``share`` itself raises a ``ClusterError``
when a worker process dies while the value is sent.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from etl.errors import ClusterError, EtlError

if TYPE_CHECKING:
    from distributed import Client, Future

T = TypeVar("T")
R = TypeVar("R")

#: Seconds the driver waits, after an error or an interrupt, for the running tasks to see ``stop`` and end.
STOP_GRACE = 10.0


class Stop(Protocol):
    """What work checks between steps: ``threading.Event`` in threads, a Dask ``Event`` on a cluster."""

    def is_set(self) -> bool: ...


def run_tasks(
    client: Client,
    work: Callable[..., R],
    items: list[T],
    on_result: Callable[[int, R], None],
    progress: Callable[[int], None] | None = None,
    *,
    shared: tuple[Any, ...] = (),
    describe: Callable[[T], str] = str,
    inputs: list[Any] | None = None,
) -> None:
    """Call ``work(*shared, item, stop, progress)`` for every item in a task on the cluster of ``client`` (``work``
    and the items are pickled: a module-level function or a ``functools.partial`` of one, and plain data; Dask
    futures in ``shared``, such as those of ``client.scatter``, arrive as their values), and ``on_result(index,
    result)`` here as each task completes. ``progress`` hears of the rows the tasks report. ``describe(item)``
    names an item in the ``ClusterError`` of a task whose workers kept dying. ``inputs``: per item, a Dask
    ``Delayed`` (such as a partition of a Dask DataFrame, ``to_delayed``) computed on the cluster, one graph for
    all, whose value the item's task gets: ``work(*shared, inputs[k], item, stop, progress)``."""
    from distributed import Event, KilledWorker, as_completed, wait
    from distributed.scheduler import NoWorkerError

    run = uuid.uuid4().hex
    stop = Event(f"etl-stop-{run}", client=client)
    topic = f"etl-progress-{run}"
    counter = _RowCounter(progress or (lambda rows: None))
    if progress is not None:
        client.subscribe_topic(topic, counter.on_event)
    if inputs is None:
        futures = [client.submit(_task, work, k, item, run, *shared, key=f"etl-task-{k}-{run}", pure=False) for k, item in enumerate(items)]
    else:
        from dask import delayed

        task = delayed(_task, pure=False)
        futures = client.compute([task(work, k, item, run, *shared, inputs[k], dask_key_name=f"etl-task-{k}-{run}") for k, item in enumerate(items)])
    index = {f.key: k for k, f in enumerate(futures)}
    try:
        for future in as_completed(futures):
            k = index[future.key]
            try:
                result, rows, error = future.result()
            except KilledWorker:
                raise ClusterError(f"{describe(items[k])}: {_DIED}") from None
            except CancelledError:  # not by us: Dask forgot the task when the only copies of its inputs died
                raise ClusterError(f"{describe(items[k])}: {_LOST}") from None
            except NoWorkerError:
                raise ClusterError(f"{describe(items[k])}: {_NONE_LEFT}") from None
            if error is not None:
                raise error
            counter.update(k, rows)  # the rows of the attempt that made the result, whatever events are still on the way
            on_result(k, cast(R, result))
    except BaseException:
        stop.set()
        try:
            wait(futures, timeout=STOP_GRACE)
        except (TimeoutError, CancelledError):  # tasks still running, or forgotten by Dask
            pass
        finally:
            client.cancel(futures)
        raise
    finally:
        if progress is not None:
            client.unsubscribe_topic(topic)


_DIED = ("stopped: the Dask worker processes holding this task died more often than distributed.scheduler.allowed-failures "
         "allows (killed, or out of memory?)")
_LOST = "stopped: Dask gave this task up when the worker processes holding its inputs died (killed, or out of memory?)"
_NONE_LEFT = "stopped: no Dask worker process was left to run this task (killed, or out of memory?)"


def share(client: Client, value: Any, what: str) -> Future:
    """``value`` sent once to every worker of ``client`` (``client.scatter``, broadcast), for ``run_tasks``'s
    ``shared``. A ``ClusterError`` naming ``what`` when a worker process dies while it is sent."""
    try:
        return client.scatter(value, broadcast=True, hash=False)
    except OSError:  # distributed's CommClosedError: the connection to a worker closed as it died
        raise ClusterError(f"{what}: could not be sent to the Dask workers: a worker process died (killed, or out of memory?)") from None


class _RowCounter:
    """The driver's side of ``progress``: events carry (item index, rows done by this attempt); each item's rows
    are reported once, however many attempts report them."""

    def __init__(self, progress: Callable[[int], None]):
        self._progress = progress
        self._done: dict[int, int] = {}
        self._lock = threading.Lock()

    def on_event(self, event: tuple[float, Any]) -> None:
        """A Dask event (timestamp, (item index, rows done by this attempt))."""
        self.update(*event[1])

    def update(self, k: int, rows: int) -> None:
        """An attempt at item ``k`` has done ``rows`` rows."""
        with self._lock:
            more = rows - self._done.get(k, 0)
            if more <= 0:
                return
            self._done[k] = rows
        self._progress(more)


def _task(work: Callable[..., R], k: int, item: T, run: str, *shared: Any) -> tuple[R | None, int, EtlError | None]:
    """What runs on a worker: ``work`` with the ``shared`` arguments, this run's stop flag and a progress reporter
    for item ``k``; returns its result, the rows it reported and the error of the input or configuration that
    stopped it, if any (handed to the driver as a value: it is the user's error, not a failure of the worker, which
    would log it as one)."""
    from distributed import Event, get_worker

    worker = get_worker()
    done = 0

    def progress(rows: int) -> None:
        nonlocal done
        done += rows
        worker.log_event(f"etl-progress-{run}", (k, done))

    try:
        return work(*shared, item, Event(f"etl-stop-{run}"), progress), done, None
    except EtlError as e:
        return None, done, e
