"""etl.bench.report: the JSON of a bench report."""

from __future__ import annotations

import json

import pytest

from etl.bench.report import PipelineReport, Report, Stage, speed_ratio


def test_json_has_every_field_and_each_stage_its_rate() -> None:
    report = Report(rows=100, files=1, input_mbytes=1.5, workers=2, batch_size=32, device="cpu")
    report.pipelines.append(PipelineReport("p.yaml", [Stage("floor", 0.5, 100, 1.5, "bare"), Stage("idle", 0.0, 100)]))
    doc = json.loads(report.to_json())
    assert doc["rows"] == 100 and doc["device"] == "cpu" and doc["peak_rss_mb"] == 0.0
    floor, idle = doc["pipelines"][0]["stages"]
    assert floor == {"name": "floor", "seconds": 0.5, "rows": 100, "mbytes": 1.5, "note": "bare", "rows_per_second": 200.0}
    assert idle["rows_per_second"] == 0.0
    assert doc["pipelines"][0]["model_data_wait"] is None and doc["pipelines"][0]["baselines"] == {}


@pytest.mark.parametrize(
    "speedup, words",
    [(2.5, "2.50× faster"), (0.73, "1.37× slower"), (0.5, "2.00× slower"), (1.0, "as fast"), (1.004, "as fast"), (0.996, "as fast")],
)
def test_speed_ratio_says_slower_when_ours_is_slower(speedup: float, words: str) -> None:
    assert speed_ratio(speedup) == words


@pytest.mark.parametrize("speedup", [0.0, -1.0, float("inf"), float("nan")])
def test_speed_ratio_refuses_what_is_no_ratio(speedup: float) -> None:
    with pytest.raises(ValueError, match="positive finite"):
        speed_ratio(speedup)
