"""The streaming loader (``Loader``): Parquet shards → transformed fixed-size batches → the device.

Rooms: ``api`` (Loader, LoaderBatch, LoaderStats), ``order`` (which rows a rank reads, in which order),
``pieces`` (reading one piece per source kind), ``assembler`` (shuffle buffers → ring slots), ``epoch`` (one
pass's threads), ``chunk`` (column layout of the pieces), ``ring`` (pinned slots, host→device copy),
``device_stage`` (the pipeline's device part after the copy).

Names are imported on first use, so that ``etl.loader.order`` and friends do not import torch.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {"Loader": "etl.loader.api", "LoaderBatch": "etl.loader.api", "LoaderStats": "etl.loader.api"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'etl.loader' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
