"""Streaming preprocessing for recommender training data. Public API:

- ``Pipeline``: load a pipeline file (``Pipeline.from_file``) or fitted artifacts (``Pipeline.load``), fit,
  transform rows held in memory (``transform_table``: the serving path);
- ``Loader``: stream Parquet shards as transformed batches into a training loop;
- ``load_schema``: read a schema file; ``raw_arrow_schema``: the Arrow schema of a schema's raw rows.

Names are imported on first use, so the command line does not pay for importing torch; ``dir(etl)`` lists them.
"""

from importlib import import_module
from types import ModuleType
from typing import Any

_EXPORTS = {
    "Loader": "etl.loader",
    "LoaderBatch": "etl.loader",
    "LoaderError": "etl.errors",
    "LoaderStats": "etl.loader",
    "Op": "etl.ops",
    "Pipeline": "etl.pipeline",
    "load_schema": "etl.schema",
    "raw_arrow_schema": "etl.io.text",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'etl' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    """The public names, the module's dunder attributes and the submodules imported so far."""
    return sorted({*__all__, *(n for n, v in globals().items() if n.startswith("__") or isinstance(v, ModuleType))})
