"""etl.bench.report: the JSON of a bench report."""

from __future__ import annotations

import json

from etl.bench.report import PipelineReport, Report, Stage


def test_json_has_every_field_and_each_stage_its_rate() -> None:
    report = Report(rows=100, files=1, input_mbytes=1.5, workers=2, batch_size=32, device="cpu")
    report.pipelines.append(PipelineReport("p.yaml", [Stage("floor", 0.5, 100, 1.5, "bare"), Stage("idle", 0.0, 100)]))
    doc = json.loads(report.to_json())
    assert doc["rows"] == 100 and doc["device"] == "cpu" and doc["peak_rss_mb"] == 0.0
    floor, idle = doc["pipelines"][0]["stages"]
    assert floor == {"name": "floor", "seconds": 0.5, "rows": 100, "mbytes": 1.5, "note": "bare", "rows_per_second": 200.0}
    assert idle["rows_per_second"] == 0.0
    assert doc["pipelines"][0]["model_data_wait"] is None and doc["pipelines"][0]["baselines"] == {}
