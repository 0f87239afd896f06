#!/usr/bin/env python3
"""Where a whole `etl preprocess` process spends its CPU: per thread, per stage, user and system time and minor
page faults, and how many cores are busy over time.

Runs `etl preprocess` (the command line, in this process) with its stage functions wrapped, and prints:

- the process: wall seconds, user and system CPU seconds, minor page faults, peak RSS;
- each thread: when it started and ended (seconds from the start of this script), its user and system CPU
  seconds and its minor faults (``getrusage(RUSAGE_THREAD)``, Linux);
- each stage, summed over the threads that ran it: calls, CPU seconds (user + system) and minor faults of the
  calling thread: the Parquet read (polars decodes in threads of its own, not counted here; they are the rest of
  the process's figures), hex decode, counting (``KeyCounter.add``, with its table growth also shown apart),
  stash put and pop, lookup table build, lookup, Parquet write (with the sha256 of what is written), artifact
  save;
- a timeline: the cores busy (user + system) in each 100 ms, from the start of the script.

On a machine shared with other jobs, compare two trees by CPU seconds and faults, not by wall time:

    PYTHONPATH=TREE python scripts/profile_preprocess.py --pipeline pipelines/criteo.yaml --input /tmp/g2m --out /tmp/prof
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

START = time.perf_counter()


@dataclass
class Usage:
    """CPU seconds and minor faults."""

    user: float = 0.0
    system: float = 0.0
    faults: int = 0
    calls: int = 0

    @classmethod
    def of_thread(cls) -> Usage:
        r = resource.getrusage(resource.RUSAGE_THREAD)
        return cls(r.ru_utime, r.ru_stime, r.ru_minflt)

    def since(self, earlier: Usage) -> Usage:
        return Usage(self.user - earlier.user, self.system - earlier.system, self.faults - earlier.faults)

    def add(self, other: Usage) -> None:
        self.user += other.user
        self.system += other.system
        self.faults += other.faults
        self.calls += 1


@dataclass
class Profile:
    """What the wrapped threads and stages used."""

    threads: list[tuple[str, float, float, Usage]] = field(default_factory=list)
    stages: dict[str, Usage] = field(default_factory=lambda: defaultdict(Usage))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def measure_threads(self) -> None:
        """Record every thread's usage from its start to its end."""
        run = threading.Thread.run
        profile = self

        def measured(thread: threading.Thread) -> None:
            began, before = time.perf_counter() - START, Usage.of_thread()
            try:
                run(thread)
            finally:
                used = Usage.of_thread().since(before)
                with profile.lock:
                    profile.threads.append((thread.name, began, time.perf_counter() - START, used))

        threading.Thread.run = measured  # type: ignore[method-assign,assignment]

    def measure(self, owner: Any, name: str, stage: str) -> None:
        """Wrap ``owner.name`` (a function or method) so that its calls count to ``stage``."""
        f: Callable[..., Any] = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            before = Usage.of_thread()
            try:
                return f(*args, **kwargs)
            finally:
                used = Usage.of_thread().since(before)
                with self.lock:
                    self.stages[stage].add(used)

        setattr(owner, name, wrapped)


def measure_stages(profile: Profile) -> None:
    """Wrap the stage functions of `etl preprocess` (imports etl, so after ``measure_threads``)."""
    import pyarrow.parquet as pq

    import etl.backends.cpu as cpu
    import etl.io.parquet as parquet
    import etl.pipeline.stash as stash
    import etl.preprocess.run as run

    for owner, name, stage in [
        (parquet, "read_rows", "Parquet read (calling thread)"),
        (cpu, "decode_hex", "hex decode"),
        (cpu.KeyCounter, "add", "counting (growth included)"),
        (cpu.KeyCounter, "_grow", "count table growth"),
        (stash.Stash, "put", "stash put (pack)"),
        (stash.Stash, "pop", "stash pop"),
        (cpu.LookupTable, "__init__", "lookup table build"),
        (cpu.LookupTable, "lookup", "lookup"),
        (pq.ParquetWriter, "write_table", "Parquet write + sha256"),
        (pq.ParquetWriter, "close", "Parquet write + sha256"),  # the file's last buffered bytes
        (run, "save_artifacts", "artifact save"),
    ]:
        profile.measure(owner, name, stage)


class Timeline:
    """The cores busy (user + system CPU seconds per second) in each ``step`` seconds, sampled by a thread this
    object owns: ``stop`` ends it."""

    def __init__(self, step: float = 0.1):
        self.step = step
        self.points: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="profile-timeline", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        last, at = os.times(), time.perf_counter()
        while not self._stop.wait(self.step):
            now, t = os.times(), time.perf_counter()
            self.points.append((t - START, (now.user - last.user + now.system - last.system) / (t - at)))
            last, at = now, t

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def report(profile: Profile, timeline: Timeline, wall: float) -> None:
    """Print the process, thread, stage and timeline figures."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    print(f"process: wall {wall:.2f} s, user {r.ru_utime:.2f} s, system {r.ru_stime:.2f} s, "
          f"{r.ru_minflt:,} minor faults, peak RSS {r.ru_maxrss / 1024:,.0f} MiB")  # fmt: skip
    print("threads (start, end in s; user, system in s; minor faults):")
    for name, began, ended, u in sorted(profile.threads, key=lambda t: t[1]):
        if name != "profile-timeline":
            print(f"  {name:16s} {began:6.2f} {ended:6.2f}  user {u.user:5.2f}  sys {u.system:5.2f}  faults {u.faults:8,}")
    print("stages (summed over threads; CPU = user + system):")
    for stage, u in profile.stages.items():
        print(f"  {stage:30s} calls {u.calls:5d}  CPU {u.user + u.system:5.2f} s  faults {u.faults:8,}")
    print(f"timeline (s: cores busy, every {timeline.step:g} s):")
    print("  " + " ".join(f"{t:.1f}:{c:.1f}" for t, c in timeline.points))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipeline", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True, help="output directory (removed first)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    profile = Profile()
    profile.measure_threads()
    timeline = Timeline()
    measure_stages(profile)
    from etl.cli import app
    from etl.runtime.startup import prepare

    prepare("preprocess")  # as the etl program does before the command
    shutil.rmtree(args.out, ignore_errors=True)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            app(["preprocess", "--pipeline", args.pipeline, "--input", args.input, "--out", args.out, "--workers", str(args.workers)],
                standalone_mode=False)  # fmt: skip
    finally:
        timeline.stop()
    report(profile, timeline, time.perf_counter() - START)


if __name__ == "__main__":
    main()
