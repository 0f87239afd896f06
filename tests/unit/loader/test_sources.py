"""etl.loader.sources: each kind of source checks its own arguments when it is opened, and gives the loader its
length, passes and positions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from etl.errors import ConfigError
from etl.io.fs import location
from etl.loader.follow import FollowSettings
from etl.loader.follow_position import FollowPosition
from etl.loader.order import row_groups
from etl.loader.settings import Batching
from etl.loader.sources import FollowedSource, ProcessedSource, Resume, ShardSource, open_source
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO

HASH = REPO / "pipelines/criteo_hash.yaml"
CPU = torch.device("cpu")
FOLLOW = FollowSettings.of(0.1, None, False, "names")
BATCHING = Batching(batch_size=400, shuffle=False, seed=0, shuffle_buffer=1600, drop_last=False, rank=0, world_size=1)


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("raw")
    generate(load_schema(REPO / "schemas/criteo.yaml"), 2000, 2, d, seed=1)
    return d


@pytest.fixture(scope="module")
def processed(raw: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("processed") / "out"
    preprocess(Pipeline.from_file(HASH), [location(str(s)) for s in sorted(raw.glob("*.parquet"))], out,
               formats=("parquet", "npy"), npy_chunk_rows=300)  # fmt: skip
    return out


def test_shards_are_read_in_epochs_with_the_stage_of_their_transform(raw: Path) -> None:
    host = ShardSource.open([location(str(raw))], HASH, None, "host", CPU)
    assert host.epochs and host.stage is None and host.output is None and not host.remote
    assert host.groups == row_groups(sorted(location(str(p)) for p in raw.glob("*.parquet")))
    assert host.total_rows == 2000 and host.length(BATCHING) == 5
    device = ShardSource.open([location(str(raw))], HASH, None, "device", CPU)
    assert device.stage is not None and device.groups == host.groups


def test_a_source_refuses_the_arguments_its_kind_cannot_read(raw: Path, processed: Path) -> None:
    with pytest.raises(ConfigError, match="raw shards need a pipeline"):
        ShardSource.open([location(str(raw))], None, None, "host", CPU)
    with pytest.raises(ConfigError, match="has ops to fit"):
        ShardSource.open([location(str(raw))], REPO / "pipelines/criteo.yaml", None, "host", CPU)
    with pytest.raises(ConfigError, match="this source is already transformed"):
        ProcessedSource.open(location(str(processed)), None, None, False, "device")
    with pytest.raises(ConfigError, match="needs num_workers >= 1 and host transforms"):
        FollowedSource.open([location(str(raw))], HASH, None, FOLLOW, num_workers=0, transform="host")
    with pytest.raises(ConfigError, match="needs num_workers >= 1 and host transforms"):
        FollowedSource.open([location(str(raw))], HASH, None, FOLLOW, num_workers=1, transform="device")
    with pytest.raises(ConfigError, match="follows one directory, got 2 sources"):
        FollowedSource.open([location(str(raw)), location(str(processed))], HASH, None, FOLLOW, num_workers=1, transform="host")
    with pytest.raises(ConfigError, match="manifest"):
        FollowedSource.open([location(str(processed))], None, None, FollowSettings.of(0.1, None, False, "manifest"), num_workers=1,
                            transform="host")  # fmt: skip


def test_open_source_tells_a_processed_output_from_raw_shards(raw: Path, processed: Path) -> None:
    shards = open_source([location(str(raw))], HASH, None, allow_partial=False, transform="host", device=CPU)
    output = open_source([location(str(processed))], None, None, allow_partial=False, transform="host", device=CPU)
    assert isinstance(shards, ShardSource) and isinstance(output, ProcessedSource)
    assert output.output is not None and not output.chunks and output.total_rows == shards.total_rows == 2000
    chunks = ProcessedSource.open(location(str(processed)), None, None, False, chunks=True)
    assert chunks.chunks and len(chunks.groups) == 8 and chunks.total_rows == 2000  # 1,000-row files in 300-row chunks


def test_an_epoch_position_round_trips_and_a_malformed_one_is_refused(raw: Path) -> None:
    source = ShardSource.open([location(str(raw))], HASH, None, "host", CPU)
    state = source.position_state(3, 2)
    assert state == {"epoch": 3, "position": 2, "total_rows": 2000}
    assert source.position_from(state) == Resume(3, 2)
    assert source.vocab_key(BATCHING, 3, 9) == (3, 5)  # past the end: the end
    with pytest.raises(ConfigError, match="malformed epoch or position"):
        source.position_from({"epoch": "x", "position": 0})


def test_a_followed_directory_has_no_length_and_its_position_is_in_the_stream(raw: Path) -> None:
    source = FollowedSource.open([location(str(raw))], HASH, None, FOLLOW, num_workers=1, transform="host")
    assert not source.epochs and source.groups == [] and source.counted is None
    with pytest.raises(TypeError, match="no length"):
        source.length(BATCHING)
    position = FollowPosition("part-00001.parquet", 1, 10, 2)
    resume = source.position_from({"follow": position.to_dict()})
    assert resume.follow == position and source.cursor.position == FollowPosition()  # read, not yet taken
    source.seek(resume)
    assert source.position_state(0, 0) == {"follow": position.to_dict(), "arrivals": "names"}
    assert source.vocab_key(BATCHING, 0, 0) == position
