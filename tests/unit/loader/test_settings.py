"""etl.loader.settings: the transform choice and the older keyword pair it replaces, Batching, the rank check."""

from __future__ import annotations

import pytest
import torch

from etl.errors import ConfigError
from etl.loader.order import batches_per_rank
from etl.loader.settings import TRANSFORMS, Batching, check_device, rank_and_world_size, transform_of


@pytest.mark.parametrize(("transform_on", "reader", "want"), [(None, None, "host"), ("host", None, "host"), ("host", "cpu", "host"),
                                                              ("device", None, "device"), ("device", "cpu", "device"),
                                                              ("device", "cudf", "cudf")])  # fmt: skip
def test_the_older_pair_maps_onto_one_transform(transform_on: str | None, reader: str | None, want: str) -> None:
    assert transform_of(None, transform_on, reader) == want


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_transform_is_taken_as_given(transform: str) -> None:
    assert transform_of(transform, None, None) == transform


def test_choices_that_name_no_transform_are_one_line_config_errors() -> None:
    cases = {("gpu", None, None): "transform must be one of 'host', 'device', 'cudf', got 'gpu'",
             ("host", "host", None): "transform='host' replaces transform_on= and reader=: give one or the other",
             ("device", None, "cpu"): "transform='device' replaces transform_on= and reader=: give one or the other",
             (None, "gpu", None): "transform_on must be 'host' or 'device', got 'gpu'",
             (None, None, "gpu"): "reader must be 'cpu' or 'cudf', got 'gpu'",
             (None, "host", "cudf"): "reader='cudf' leaves the rows in GPU memory: it needs transform_on='device'"}  # fmt: skip
    for args, message in cases.items():
        with pytest.raises(ConfigError) as info:
            transform_of(*args)
        assert str(info.value) == message


def test_batching_gives_the_passes_and_lengths_of_its_settings() -> None:
    b = Batching(batch_size=100, shuffle=True, seed=3, shuffle_buffer=400, drop_last=False, rank=1, world_size=3)
    assert b.length(1_000) == batches_per_rank(1_000, 3, 100, False) == 4
    s = b.pass_settings(2, 1, 4)
    assert (s.epoch, s.start, s.total, s.batch_size, s.shuffle_buffer, s.shuffle, s.seed, s.rank, s.world_size) == (2, 1, 4, 100, 400, True, 3, 1, 3)
    with pytest.raises(AttributeError):
        b.seed = 4  # type: ignore[misc]  # frozen


def test_rank_and_world_size_are_checked() -> None:
    assert rank_and_world_size(None, None, 100, 10, False) == (0, 1)
    assert rank_and_world_size(1, 2, 100, 10, True) == (1, 2)
    for rank, world in ((0, None), (2, 2), (0, 0)):
        with pytest.raises(ConfigError, match="rank and world_size must be given together"):
            rank_and_world_size(rank, world, 100, 10, False)
    with pytest.raises(ConfigError, match="batch_size=60 is larger than the 50 rows of a rank"):
        rank_and_world_size(0, 2, 100, 60, True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_a_cuda_device_without_cuda_is_refused() -> None:
    assert check_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        check_device("cuda")
