"""etl.pipeline.plan: the stages a pipeline's ops are fitted in, what feeds each stage and which columns it reads."""

from __future__ import annotations

from pathlib import Path

import yaml

from etl.pipeline import Pipeline
from etl.pipeline.plan import fit_plan, fit_stages, stage_name
from tests.unit.pipeline.conftest import DLRM, PIPELINES, write_pipeline


def test_an_op_reading_what_an_unfitted_op_writes_waits_for_a_later_stage(tmp_path: Path) -> None:
    ops = [DLRM[0], {"op": "Normalize", "columns": "@dense"}, {"op": "Normalize", "columns": "@dense"}, *DLRM[3:]]
    p = Pipeline.from_file(write_pipeline(tmp_path, ops))
    stages = fit_stages(p.ops)
    assert [[op.name for op in s] for s in stages] == [["Normalize"], ["Normalize"]]
    assert stages[0][0] is p.ops[1] and stages[1][0] is p.ops[2]
    # the second stage is fed by everything before it that writes what it reads, the first Normalize included
    prep, columns = fit_plan(p, stages[1])
    assert [op.name for op in prep] == ["FillMissing", "Normalize"]
    assert columns == [c for c in p.schema.names if c in set(p.schema.by_role("label")) | set(p.schema.by_role("dense"))]
    assert [stage_name(k, 2) for k in range(2)] == ["fit 1/2", "fit 2/2"] and stage_name(0, 1) == "fit"


def test_the_dlrm_pipeline_fits_in_one_stage_and_a_hash_pipeline_in_none() -> None:
    p = Pipeline.from_file(PIPELINES / "criteo.yaml")
    stages = fit_stages(p.ops)
    assert [[op.name for op in s] for s in stages] == [["Categorify"]]
    prep, columns = fit_plan(p, stages[0])
    assert [op.name for op in prep] == ["Decode"]
    assert set(columns) == set(p.schema.by_role("label")) | set(p.schema.by_role("categorical"))
    assert fit_stages(Pipeline.from_file(PIPELINES / "criteo_hash.yaml").ops) == []


def test_a_fit_before_groupby_reads_its_key_to_skip_the_events_without_one(tmp_path: Path) -> None:
    doc = {"schema": str(PIPELINES.parent / "schemas/movielens.yaml"),
           "ops": [{"op": "Decode", "columns": ["movieId"]}, {"op": "Categorify", "columns": ["movieId"]},
                   {"op": "Groupby", "by": ["timestamp"], "aggs": {"movieId": ["list"]}, "max_len": 5}]}  # fmt: skip
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    p = Pipeline.from_file(tmp_path / "p.yaml")
    (stage,) = fit_stages(p.ops)
    prep, columns = fit_plan(p, stage)
    assert [op.name for op in prep] == ["Decode"] and columns == ["movieId", "rating", "timestamp"]  # the key: read, not transformed
