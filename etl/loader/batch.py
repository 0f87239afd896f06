"""``LoaderBatch``: one batch as a loader hands it to the training loop, whatever its engine; also a read-only
mapping of its tensors by name (``batch["label"]``, ``batch["C1"]``), whose views are made when asked for."""

from __future__ import annotations

import dataclasses
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from dataclasses import dataclass, field
from typing import Any

import torch

from etl.ops.online_vocab import VocabEvents

#: the keys of the fields themselves, first among a batch's keys (a column of one of these names is reached
#: through its field, e.g. ``batch.dense[:, j]``)
FIELDS = ("label", "dense", "sparse")
#: a list column's jagged parts are the keys ``{column}__values`` and ``{column}__offsets``
VALUES, OFFSETS = "__values", "__offsets"


@dataclass
class LoaderBatch(Mapping[str, torch.Tensor]):
    """One batch: ``label`` [B] float32, ``dense`` [B, D] float32, ``sparse`` [B, S] ids (columns in the order of
    ``Loader.layout``), ``lists``: multi-hot columns as (values, offsets[B + 1]), ``sparse_names`` and
    ``dense_names`` the names of ``sparse``'s and ``dense``'s columns.

    Passthrough columns (schema role ``passthrough``, such as a row id) are not in loader batches: the loader does
    not read them from raw shards nor from a processed output. They serve the offline path: ``etl preprocess``
    writes them, unchanged, beside the transformed columns of each row.

    ``label``, ``dense`` and ``sparse`` are views of a ring slot that the loader reuses: the next batch (the next
    ``next()`` on the loader's iterator) overwrites them. Keep a batch by cloning its tensors, or build the loader
    with ``copy=True``, whose batches own their tensors. The ``lists`` tensors are made for each batch.

    ``vocab_events``: with online vocabularies (Categorify ``online: true``), one ``VocabEvents`` per online column
    (numpy arrays, in the order it happened: ``admitted_ids`` with ``admitted_keys``, ``evicted_ids`` with
    ``evicted_keys``; ids as ``sparse`` holds them): the ids given and taken back by this batch's rows, which get
    their ids in the batch's row order (``etl.loader.stream_state``). An id evicted in a batch is given again only in a
    later one, so within a batch an id names one key. Reset the embedding rows of ``admitted_ids`` before training
    on the batch: no row of an evicted key uses its id in or after the batch that admits the new key. Empty without
    online columns.

    Sequences (the list columns of a History op, ``etl.loader.sequences``): ``lengths``, per History op its lengths
    column (``hist_len``) → [B] int32, each row's history length (not in ``sparse`` nor ``to_kjt``); the lists are
    in ``lists`` as jagged values + offsets; with the loader's ``pad_to``, ``padded`` also gives each list column
    as [B, L] ids (``sparse``'s dtype): a row's latest ``min(length, L)`` entries, oldest first, the rest ``0`` (the
    padding id, ``etl.ids.PAD``), on the loader's ``pad_side``. ``lengths`` and ``padded`` are views of the ring
    slot, as ``sparse`` is.

    A batch is also a read-only mapping of its tensors (``collections.abc.Mapping``), in this key order: ``label``,
    ``dense``, ``sparse`` (the fields), each dense then sparse column by name (``batch["I3"]`` is
    ``batch.dense[:, j]``, ``batch["C1"]`` is ``batch.sparse[:, k]``: [B] strided views, no copy), each lengths
    column (``batch["hist_len"]``), each padded list column by name ([B, L], with ``pad_to``), and for every list
    column ``{column}__values`` and ``{column}__offsets``. A key names one tensor; ``vocab_events`` and the names
    are attributes only. Views are made when a key is read, so a loop that does not use the mapping pays nothing
    for it. ``len(batch)`` is the number of rows, as ``len`` of a tensor (and of tensordict's ``TensorDict``);
    ``len(batch.keys())`` the number of keys. ``dict(batch)``, ``batch.keys()``/``values()``/``items()``,
    ``in`` and ``**batch`` work as on any mapping. ``to(device)`` moves the batch (what Lightning calls)."""

    label: torch.Tensor
    dense: torch.Tensor
    sparse: torch.Tensor
    lists: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    sparse_names: list[str] = field(default_factory=list)
    vocab_events: dict[str, VocabEvents] = field(default_factory=dict)
    lengths: dict[str, torch.Tensor] = field(default_factory=dict)
    padded: dict[str, torch.Tensor] = field(default_factory=dict)
    dense_names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        """The number of rows (not of keys: ``len(batch.keys())``)."""
        return self.label.shape[0]

    def __iter__(self) -> Iterator[str]:
        """The keys, each once, in the order of the class docstring."""
        jagged = [c + part for c in self.lists for part in (VALUES, OFFSETS)]
        return iter(dict.fromkeys([*FIELDS, *self.dense_names, *self.sparse_names, *self.lengths, *self.padded, *jagged]))

    def __getitem__(self, key: str) -> torch.Tensor:
        """The tensor of ``key`` (see the class docstring); a column's view is made here. ``KeyError`` naming the
        keys for any other key."""
        if key in FIELDS:
            return self.label if key == "label" else self.dense if key == "dense" else self.sparse
        if key in self.dense_names:
            return self.dense[:, self.dense_names.index(key)]
        if key in self.sparse_names:
            return self.sparse[:, self.sparse_names.index(key)]
        if key in self.lengths:
            return self.lengths[key]
        if key in self.padded:
            return self.padded[key]
        if isinstance(key, str):
            for part, i in ((VALUES, 0), (OFFSETS, 1)):
                if key.endswith(part) and key[: -len(part)] in self.lists:
                    return self.lists[key[: -len(part)]][i]
        raise KeyError(f"{key!r} is no key of this batch; its keys: {', '.join(self)}")

    def keys(self) -> KeysView[str]:
        return _Keys(self)

    def values(self) -> ValuesView[torch.Tensor]:
        return _Values(self)

    def items(self) -> ItemsView[str, torch.Tensor]:
        return _Items(self)

    def to(self, device: str | torch.device, non_blocking: bool = False) -> LoaderBatch:
        """This batch with every tensor on ``device`` (``Tensor.to``: a tensor already there is the same tensor, so
        a view of the ring slot stays one); ``vocab_events`` and the names are shared. Lightning moves a batch to
        its device with this method; a loader built with ``device=`` hands out batches already there."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        return dataclasses.replace(self, label=move(self.label), dense=move(self.dense), sparse=move(self.sparse),
                                   lists={c: (move(v), move(o)) for c, (v, o) in self.lists.items()},
                                   lengths={c: move(t) for c, t in self.lengths.items()},
                                   padded={c: move(t) for c, t in self.padded.items()})  # fmt: skip

    def to_kjt(self) -> Any:
        """The sparse and list columns as a TorchRec ``KeyedJaggedTensor`` (keys: sparse columns, then lists, the
        History lists among them as jagged features; values key-major). Needs torchrec installed."""
        try:
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
        except ImportError as e:
            raise ImportError("LoaderBatch.to_kjt needs torchrec (pip install torchrec)") from e
        ids = self.sparse.long()
        values = [ids.t().reshape(-1)] + [v.long() for v, _ in self.lists.values()]
        lengths = [torch.ones(ids.numel(), dtype=torch.int32, device=ids.device)]
        lengths += [(o[1:] - o[:-1]).to(torch.int32) for _, o in self.lists.values()]
        return KeyedJaggedTensor.from_lengths_sync(keys=self.sparse_names + list(self.lists), values=torch.cat(values), lengths=torch.cat(lengths))


class _Counted:
    """The length of a view of a batch: the number of its keys (a batch's own length is its rows)."""

    _mapping: Mapping[str, torch.Tensor]

    def __len__(self) -> int:
        return sum(1 for _ in self._mapping)


class _Keys(_Counted, KeysView[str]):
    """A batch's keys."""


class _Values(_Counted, ValuesView[torch.Tensor]):
    """A batch's tensors, in key order."""


class _Items(_Counted, ItemsView[str, torch.Tensor]):
    """A batch's (key, tensor) pairs, in key order."""
