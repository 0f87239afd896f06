"""Reshaping stages: the ``stages`` list of a pipeline file, running them on a row group (row numbers kept, counts),
and fitting on the rows they keep (threads, the single pass, a Dask cluster) as on shards filtered beforehand."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from etl.errors import SpecError
from etl.io.parquet import batch_from_arrow, open_shard
from etl.io.processed import StageRows
from etl.pipeline import Pipeline
from etl.pipeline.filter import OPS
from etl.pipeline.single_pass import fit_stashing
from etl.pipeline.stages import read_staged, stage_totals, staged_batch
from etl.pipeline.stash import Stash
from etl.schema import load_schema
from tests.conftest import REPO, criteo_table, filtered_copies, pipeline_with_stages

CRITEO = REPO / "pipelines/criteo.yaml"
SCHEMA = load_schema(REPO / "schemas/criteo.yaml")
KEEP_I1 = {"stage": "Filter", "where": {"column": "I1", "op": ">=", "value": 100}}
KEEP_C2 = {"stage": "Filter", "where": {"column": "C2", "op": "not_null"}}


def reference_keep(t: pa.Table) -> pa.Array:
    """What KEEP_I1 then KEEP_C2 keep, written with pyarrow compute."""
    return pc.and_(pc.greater_equal(t["I1"], 100), pc.is_valid(t["C2"]))


def doc(stages: object) -> dict:
    d = yaml.safe_load(CRITEO.read_text())
    d["stages"] = stages
    return d


def test_a_pipeline_without_stages_has_none_and_one_with_stages_parses_them() -> None:
    assert Pipeline.from_file(CRITEO).stages == []
    p = Pipeline(doc([KEEP_I1, KEEP_C2]), SCHEMA, "p.yaml")
    assert [(s.name, s.scope, s.columns) for s in p.stages] == [("Filter", "rows", ["I1"]), ("Filter", "rows", ["C2"])]


@pytest.mark.parametrize(
    "stages,field,message",
    [
        ({"stage": "Filter"}, "stages", "expected a list of stages"),
        (["Filter"], "stages[0]", "expected a mapping with a 'stage' key"),
        ([{"where": {}}], "stages[0]", "expected a mapping with a 'stage' key"),
        ([KEEP_I1, {"stage": "Grouping", "key": "C1"}], "stages[1].stage", "unknown stage 'Grouping'; known: ['Filter']"),
        ([KEEP_I1, {"stage": "Groupby", "by": ["C1"]}], "stages[1].stage", "write it as the last entry of ops"),
        ([{"stage": "Filter", "where": {"column": "I1", "op": ">=", "value": "100"}}], "stages[0] (Filter).where.value", "not an integer"),
    ],
)
def test_a_bad_stages_list_names_the_file_and_the_field(stages: object, field: str, message: str) -> None:
    with pytest.raises(SpecError) as e:
        Pipeline(doc(stages), SCHEMA, "p.yaml")
    assert str(e.value).startswith(f"p.yaml: field '{field}': ") and message in str(e.value)


def test_staged_batch_keeps_the_source_row_numbers_and_counts_each_stage() -> None:
    p = Pipeline(doc([KEEP_I1, KEEP_C2]), SCHEMA, "p.yaml")
    table = criteo_table(300, seed=3)
    batch, counts = staged_batch(p.stages, SCHEMA, table, "s.parquet", 2, 1000)
    kept = np.flatnonzero(pc.fill_null(reference_keep(table), False).to_numpy(zero_copy_only=False))
    after_i1 = int(pc.sum(pc.fill_null(pc.greater_equal(table["I1"], 100), False)).as_py())
    assert counts == (StageRows("Filter", 300, after_i1), StageRows("Filter", after_i1, len(kept)))
    assert 0 < len(kept) < after_i1 < 300
    assert batch.row_ids.tolist() == (1000 + kept).tolist() and (batch.source, batch.row_group) == ("s.parquet", 2)
    whole = batch_from_arrow(table, SCHEMA, "s.parquet", 2, 1000).take(kept)
    for c in SCHEMA.names:
        assert np.array_equal(batch[c].values.to_list() if c.startswith("C") else batch[c].values, whole[c].values.to_list() if c.startswith("C")
                              else whole[c].values), c  # fmt: skip


def test_without_stages_the_batch_is_batch_from_arrow_s() -> None:
    table = criteo_table(50, seed=1)
    batch, counts = staged_batch([], SCHEMA, table, "s.parquet", 0, 0, ["label", "I1"])
    assert counts == () and list(batch.columns) == ["label", "I1"] and batch.num_rows == 50


def test_a_row_group_whose_rows_are_all_removed_is_an_empty_batch() -> None:
    p = Pipeline(doc([{"stage": "Filter", "where": {"column": "I1", "op": ">", "value": 10**6}}]), SCHEMA, "p.yaml")
    batch, counts = staged_batch(p.stages, SCHEMA, criteo_table(40), "s.parquet", 0, 0)
    assert batch.num_rows == 0 and len(batch.row_ids) == 0 and len(batch["C1"]) == 0
    assert counts == (StageRows("Filter", 40, 0),)


def test_read_staged_reads_the_columns_of_the_stages_without_adding_them_to_the_batch(tmp_path: Path) -> None:
    pq.write_table(criteo_table(120, seed=2), tmp_path / "s.parquet", row_group_size=50)
    p = Pipeline(doc([KEEP_C2]), SCHEMA, "p.yaml")
    shard = open_shard(tmp_path / "s.parquet", SCHEMA)
    batch, counts = read_staged(p.stages, shard, 1, ["label", "I3"])
    table = shard.read_table(1)
    kept = np.flatnonzero(table["C2"].is_valid().to_numpy(zero_copy_only=False))
    assert list(batch.columns) == ["label", "I3"] and batch.row_ids.tolist() == (50 + kept).tolist()
    assert counts == (StageRows("Filter", 50, len(kept)),)


def test_stage_totals_sum_per_stage_and_refuse_counts_of_other_stages() -> None:
    p = Pipeline(doc([KEEP_I1, KEEP_C2]), SCHEMA, "p.yaml")
    assert stage_totals([], []) is None
    assert stage_totals(p.stages, []) == (StageRows("Filter", 0, 0), StageRows("Filter", 0, 0))
    batches = [(StageRows("Filter", 10, 6), StageRows("Filter", 6, 5)), (StageRows("Filter", 4, 4), StageRows("Filter", 4, 1))]
    assert stage_totals(p.stages, batches) == (StageRows("Filter", 14, 10), StageRows("Filter", 10, 6))
    with pytest.raises(ValueError, match="do not all list"):
        stage_totals(p.stages, [(StageRows("Filter", 10, 6),)])


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("raw")
    paths = []
    for i, n in enumerate([400, 260, 330]):
        pq.write_table(criteo_table(n, seed=10 + i), d / f"{i}.parquet", row_group_size=90)
        paths.append(d / f"{i}.parquet")
    return paths


def states(p: Pipeline) -> list:
    """The fitted state of every op (JSON and tables)."""
    out = []
    for op in p.ops:
        state, tables = op.state()
        out.append((state, {k: t.to_pydict() for k, t in tables.items()}))
    return out


@pytest.fixture(scope="module")
def reference(shards: list[Path], tmp_path_factory) -> list:
    """The state of the criteo pipeline (no stages) fitted on the shards filtered beforehand with pyarrow."""
    p = Pipeline.from_file(CRITEO)
    p.fit(filtered_copies(shards, reference_keep, tmp_path_factory.mktemp("filtered")))
    return states(p)


def staged(tmp_path: Path) -> Pipeline:
    return Pipeline.from_file(pipeline_with_stages(CRITEO, [KEEP_I1, KEEP_C2], tmp_path / "p.yaml"))


@pytest.mark.parametrize("workers", [1, 3])
def test_the_fit_sees_only_the_rows_the_stages_keep(shards: list[Path], reference: list, tmp_path: Path, workers: int) -> None:
    p = staged(tmp_path)
    p.fit(shards, workers=workers)
    assert states(p) == reference
    everything = Pipeline.from_file(CRITEO)
    everything.fit(shards)
    assert states(everything) != reference  # the stages do make a difference to the vocabularies


def test_the_single_pass_fit_sees_only_the_rows_the_stages_keep(shards: list[Path], reference: list, tmp_path: Path) -> None:
    p = staged(tmp_path)
    with Stash(1 << 30, tmp_path) as stash:
        fit_stashing(p, shards, stash, {0, 2}, workers=2)
    assert states(p) == reference


def test_the_fit_on_a_dask_cluster_sees_only_the_rows_the_stages_keep(shards: list[Path], reference: list, tmp_path: Path,
                                                                      local_cluster) -> None:  # fmt: skip
    p = staged(tmp_path)
    p.fit(shards, client=local_cluster, workdir=tmp_path)
    assert states(p) == reference


def test_transform_table_gives_every_row_its_output_row(tmp_path: Path) -> None:
    p = staged(tmp_path)
    table = criteo_table(60, seed=4)
    pq.write_table(table, tmp_path / "s.parquet")
    p.fit([tmp_path / "s.parquet"])
    assert p.transform_table(table).num_rows == 60


def test_the_documented_example_and_the_stages_section_hold() -> None:
    text = (REPO / "pipelines/README.md").read_text()
    section = text.split("\n## Stages\n", 1)[1].split("\n## ", 1)[0]
    example = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    p = Pipeline(example, SCHEMA, "pipelines/README.md")
    assert [s.name for s in p.stages] == ["Filter", "Filter"]
    assert "### Filter" in section and all(f"`{k}`" in section for k in ("where", "all", "any", "not"))
    assert all(f"`{op}`" in section or f"op: {op}," in section for op in OPS), [op for op in OPS if f"`{op}`" not in section]
