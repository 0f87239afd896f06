#!/usr/bin/env python3
"""Fixed costs of a fit, per run whatever the row count: ``Categorify.finalize`` (thresholds, vocabulary order,
vocabulary tables, every column) and the save of the artifacts, in wall and CPU seconds of this process, over one
fit of a pipeline on some shards. Run it from a checkout (``PYTHONPATH=.``) to time that checkout's code:

    PYTHONPATH=. python scripts/bench_fixed_costs.py --pipeline pipelines/criteo.yaml --input /tmp/g2m
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

from etl.io.parquet import list_shards
from etl.ops.categorical import Categorify
from etl.pipeline import Pipeline, artifacts

spent: dict[str, list[float]] = {}


def timed(owner: Any, name: str, label: str) -> None:
    """Replace ``owner.name`` by a wrapper adding its wall and CPU seconds to ``spent[label]``."""
    fn: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            total = spent.setdefault(label, [0.0, 0.0])
            total[0] += time.perf_counter() - wall
            total[1] += time.process_time() - cpu

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", required=True)
    ap.add_argument("--input", required=True, nargs="+")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    timed(Categorify, "finalize", "Categorify.finalize")
    timed(artifacts, "save", "artifacts save")
    p = Pipeline.from_file(args.pipeline)
    p.fit(list_shards(args.input), workers=args.workers)
    with tempfile.TemporaryDirectory() as d:
        p.save(d)
    for label, (wall, cpu) in spent.items():
        print(f"{label}: wall {wall:.3f} s, cpu {cpu:.3f} s")


if __name__ == "__main__":
    main()
