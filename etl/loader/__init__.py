"""The streaming loader (``Loader``): Parquet shards → transformed fixed-size batches → the device.

Modules, from the training loop inwards (``api``'s docstring tells how they work together):

- ``api``: ``Loader``: its keywords, checked once, pick a source and an engine; epochs, position and ``state_dict``;
- ``batch``: ``LoaderBatch``, one batch as the training loop gets it;
- ``settings``: ``Batching`` (batch size, shuffle, rank...), the ``transform`` choice, the rank check;
- ``sources``: where rows come from: ``ShardSource``, ``ProcessedSource``, ``FollowedSource``, each checking its own
  arguments; length, passes and positions per kind;
- ``threads``: ``ThreadEngine``, the default engine: the ring, the next epoch's pass, the consumer's iteration;
- ``epoch``: ``EpochPass``, one pass over an epoch: its assembler thread, reader pool, ready queue and shutdown;
- ``follow``: ``FollowPass``, the never-ending pass of follow mode over shards as they arrive, and its position;
- ``assembler``: pieces → shuffle buffers → batches in ring slots;
- ``pieces``: reading and transforming one piece, per kind of source;
- ``order``: which rows a rank reads, in which order;
- ``chunk``: the column layout of rows between the pipeline and the ring;
- ``sequences``: the lists of a History op in batches: their lengths, and padded to ``pad_to``;
- ``ring``: pinned slots and the host→device copy;
- ``device_stage``: the pipeline's device part, after the copy (``transform="device"``);
- ``device_columns``: rows read into device memory (``transform="cudf"``): host part, chunks and gather on the device;
- ``cudf_columns``: the cudf adapter, Parquet row groups → device columns (the only module that imports cudf);
- ``stream_state``: streaming states (online vocabularies), applied by the assembler, and their state;
- ``stats``: ``LoaderStats``, where the time goes;
- ``dali_engine``: ``DaliEngine``, the engine of ``Loader(processed_dir, engine="dali")``: npy chunks read by NVIDIA
  DALI (``dali.DaliLoader``: that loader under its former class name).

Names are imported on first use, so that ``etl.loader.order`` and friends do not import torch.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {"Loader": "etl.loader.api", "LoaderBatch": "etl.loader.api", "LoaderStats": "etl.loader.stats"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'etl.loader' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
