"""LoaderBatch as a mapping of tensors: keys, zero-copy column views, views of the right length, ``to``, and what
torch's DataLoader makes of it (a loader's batches as DataLoader items: tests/unit/loader/test_api.py)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from torch.utils.data._utils.collate import default_convert

from etl.loader import LoaderBatch
from etl.ops.online_vocab import VocabEvents


def _batch() -> LoaderBatch:
    """3 rows: dense I1, I2; sparse C1, C2; a lengths column; a padded list column 'hist' and a jagged one 'g'."""
    return LoaderBatch(
        label=torch.tensor([0.0, 1.0, 0.0]),
        dense=torch.arange(6, dtype=torch.float32).reshape(3, 2),
        sparse=torch.tensor([[5, 7], [6, 8], [9, 2]], dtype=torch.int32),
        lists={"hist": (torch.tensor([3, 4, 5]), torch.tensor([0, 2, 2, 3])), "g": (torch.tensor([1]), torch.tensor([0, 0, 1, 1]))},
        sparse_names=["C1", "C2"],
        vocab_events={"C1": VocabEvents.none()},
        lengths={"hist_len": torch.tensor([2, 0, 1], dtype=torch.int32)},
        padded={"hist": torch.tensor([[3, 4], [0, 0], [5, 0]], dtype=torch.int32)},
        dense_names=["I1", "I2"],
    )


KEYS = ["label", "dense", "sparse", "I1", "I2", "C1", "C2", "hist_len", "hist", "hist__values", "hist__offsets", "g__values", "g__offsets"]


def test_a_batch_is_a_mapping_of_its_tensors_in_a_fixed_key_order() -> None:
    b = _batch()
    assert isinstance(b, Mapping)
    assert list(b) == list(b.keys()) == KEYS
    assert len(b.keys()) == len(b.values()) == len(b.items()) == len(dict(b)) == len(KEYS)
    assert len(b) == 3  # the rows, as before the mapping and as len() of a tensor
    assert all(isinstance(v, torch.Tensor) for v in b.values()) and [k for k, _ in b.items()] == KEYS
    assert "label" in b and "C2" in b and "hist__offsets" in b and "C3" not in b and "vocab_events" not in b and 0 not in b
    assert b["label"] is b.label and b["dense"] is b.dense and b["sparse"] is b.sparse
    assert b["hist_len"] is b.lengths["hist_len"] and b["hist"] is b.padded["hist"]
    assert b["hist__values"] is b.lists["hist"][0] and b["g__offsets"] is b.lists["g"][1]
    assert b.get("nope") is None and set(b.keys()) & {"C1", "x"} == {"C1"}
    assert (lambda **kw: sorted(kw))(**b) == sorted(KEYS)


def test_column_keys_are_views_of_their_field_without_a_copy() -> None:
    b = _batch()
    assert b["I2"].tolist() == [1.0, 3.0, 5.0] and b["C1"].tolist() == [5, 6, 9] and b["C2"].dtype == torch.int32
    b.sparse[1, 0] = 42  # the view sees the field's memory
    assert b["C1"].tolist() == [5, 42, 9]
    assert b["C1"].untyped_storage().data_ptr() == b.sparse.untyped_storage().data_ptr()


def test_an_unknown_key_is_a_key_error_listing_the_keys() -> None:
    with pytest.raises(KeyError, match=r"'C9' is no key of this batch; its keys: label, dense, sparse, I1, I2, C1"):
        _batch()["C9"]
    with pytest.raises(KeyError):
        _batch()["hist__lengths"]


def test_a_column_named_like_a_field_is_reached_through_the_field() -> None:
    b = LoaderBatch(torch.zeros(2), torch.ones(2, 1), torch.zeros(2, 2, dtype=torch.int32), sparse_names=["sparse", "C1"], dense_names=["x"])
    assert list(b) == ["label", "dense", "sparse", "x", "C1"] and len(b.keys()) == 5
    assert b["sparse"] is b.sparse


def test_a_batch_without_columns_or_lists_keeps_the_three_fields() -> None:
    b = LoaderBatch(torch.zeros(4), torch.zeros(4, 0), torch.zeros(4, 0, dtype=torch.int64))
    assert list(b) == ["label", "dense", "sparse"] and len(b) == 4


def test_to_moves_every_tensor_and_keeps_the_rest() -> None:
    b = _batch()
    moved = b.to("meta")
    assert type(moved) is LoaderBatch and len(moved) == 3 and list(moved) == KEYS
    assert all(v.device.type == "meta" for v in moved.values())
    assert moved.vocab_events is b.vocab_events and moved.sparse_names == ["C1", "C2"] and moved.dense_names == ["I1", "I2"]
    assert all(v.device.type == "cpu" for v in b.values())  # the batch itself is unchanged
    same = b.to("cpu", non_blocking=True)
    assert same.sparse is b.sparse and same.lists["g"][0] is b.lists["g"][0]  # already there: the same tensors


def test_torch_default_convert_makes_a_dict_of_the_same_tensors() -> None:
    # what DataLoader(loader, batch_size=None) does to each item
    b = _batch()
    converted = default_convert(b)
    assert type(converted) is dict and list(converted) == KEYS
    assert converted["sparse"] is b.sparse and converted["C1"].untyped_storage().data_ptr() == b.sparse.untyped_storage().data_ptr()
