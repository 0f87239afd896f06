"""Streaming preprocessing for recommender training data. Public API:

- ``Pipeline``: load a pipeline file (``Pipeline.from_file``) or fitted artifacts (``Pipeline.load``), fit,
  transform one in-memory table (``transform_table``);
- ``Loader``: stream Parquet shards as transformed batches into a training loop;
- ``load_schema``: read a schema file.
"""

from etl.loader import Loader, LoaderBatch, LoaderError, LoaderStats
from etl.pipeline import Pipeline
from etl.schema import load_schema

__all__ = ["Loader", "LoaderBatch", "LoaderError", "LoaderStats", "Pipeline", "load_schema"]
