"""The results of ``etl bench`` (``etl.bench.run``): one ``Report`` per run, one ``PipelineReport`` per pipeline, one
``Stage`` per measured step; as JSON (``Report.to_json``) and as a PNG chart (``plot``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Stage:
    """One measured step: ``seconds`` spent on ``rows`` rows (``mbytes``: the input Parquet it read, 0 when it read
    none)."""

    name: str
    seconds: float
    rows: int
    mbytes: float = 0.0
    note: str = ""

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Freshness:
    """A following loader fed by a producer (``etl.bench.freshness``): ``shards`` of ``shard_rows`` rows written at
    ``rate`` per second, polled every ``poll_interval`` seconds, a simulated step of ``step_seconds``; the read and
    transform time of one shard; the lag of each shard, from its rename (or its listing in the producer manifest,
    with ``arrivals`` "manifest") to its first row in a batch (seconds, ``lags`` in shard order) and their p50, p99
    and max."""

    rate: float
    shard_rows: int
    shards: int
    poll_interval: float
    step_seconds: float
    shard_transform_seconds: float
    lag_p50: float
    lag_p99: float
    lag_max: float
    lags: list[float] = field(default_factory=list)
    arrivals: str = "names"

    @property
    def bound(self) -> float:
        """The must-hold bound of the lag p99: 2 × poll interval + one shard's transform time."""
        return 2 * self.poll_interval + self.shard_transform_seconds

    @property
    def holds(self) -> bool:
        """Whether this run's lag p99 is under ``bound``."""
        return self.lag_p99 < self.bound


@dataclass
class PipelineReport:
    """The measurements of one pipeline: its stages in the order they ran, data-wait shares (of the loop's time, 0 to
    1), the baselines' results by name."""

    pipeline: str
    stages: list[Stage] = field(default_factory=list)
    data_wait: float = 0.0  # the second of two epochs with the simulated step (a training run's later epochs)
    data_wait_first_epoch: float = 0.0  # the first one, after an epoch with no step (starts colder)
    wait_timeline: list[float] = field(default_factory=list)  # seconds waited before each batch of the second
    model_data_wait: float | None = None
    device_data_wait: float | None = None  # data_wait with transform_on="device"
    baselines: dict[str, dict] = field(default_factory=dict)
    freshness: Freshness | None = None  # etl bench --follow


@dataclass
class Report:
    """One ``etl bench`` run: the input (rows, shards, MB of Parquet), the settings, one report per pipeline and the
    peak resident set size of the process."""

    rows: int
    files: int
    input_mbytes: float
    workers: int
    batch_size: int
    device: str
    pipelines: list[PipelineReport] = field(default_factory=list)
    peak_rss_mb: float = 0.0

    def to_json(self) -> str:
        """The report as an indented JSON document; every stage also carries its ``rows_per_second``, a freshness its
        ``bound`` and ``holds``."""
        doc = asdict(self)
        for p, rep in zip(doc["pipelines"], self.pipelines):
            for s, stage in zip(p["stages"], rep.stages):
                s["rows_per_second"] = stage.rows_per_second
            if rep.freshness is not None:
                p["freshness"] |= {"bound": rep.freshness.bound, "holds": rep.freshness.holds}
        return json.dumps(doc, indent=1)


def speed_ratio(speedup: float) -> str:
    """How much faster ours is, in words, from ``speedup`` (their time / ours, a baseline's ``speedup_of_ours``):
    ``"1.37× faster"``, ``"1.37× slower"`` (for 0.73: their time is 0.73 of ours, ours takes 1.37 times theirs), or
    ``"as fast"`` when the two agree to two decimals."""
    if not speedup > 0 or not np.isfinite(speedup):
        raise ValueError(f"a speedup is a positive finite ratio, got {speedup!r}")
    if f"{speedup:.2f}" == "1.00" or f"{1 / speedup:.2f}" == "1.00":
        return "as fast"
    return f"{speedup:.2f}× faster" if speedup > 1 else f"{1 / speedup:.2f}× slower"


def plot(report: Report, path: Path) -> None:
    """PNG: per-stage throughput of each pipeline (log scale) and the stall timeline (wait before each batch)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(report.pipelines), 2, figsize=(13, 4 * len(report.pipelines)), squeeze=False)
    for (left, right), rep in zip(axes, report.pipelines):
        names = [s.name for s in rep.stages]
        left.barh(names, [s.rows_per_second / 1e6 for s in rep.stages], color="tab:blue")
        left.set_xscale("log")
        left.invert_yaxis()
        left.set_xlabel("M rows/s")
        left.set_title(f"{Path(rep.pipeline).name}: stages")
        right.bar(np.arange(len(rep.wait_timeline)), [1000 * w for w in rep.wait_timeline], color="tab:red")
        right.set_xlabel("batch")
        right.set_ylabel("wait before batch (ms)")
        right.set_title(f"stall timeline: data wait {100 * rep.data_wait:.2f} %")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
