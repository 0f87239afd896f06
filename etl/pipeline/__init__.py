"""Pipelines: a schema plus an ordered list of ops.

Rooms: ``core`` (the spec, column-kind flow, host/device split, transforming one batch), ``fit`` (fitting over
shards: the plan and the threaded executor), ``single_pass`` (a threaded fit that keeps what it read for the
transform) and ``stash`` (where it keeps it), ``distributed`` (the Dask executor) and ``spill`` (its count-table
files), ``artifacts`` (saving and loading the fitted state, and checking that artifacts match a pipeline),
``stages`` and ``filter`` (reshaping stages of row scope), ``groupby`` and ``groups`` (the stage of key scope: one
row per group of events) and ``exchange`` (the exchange by key that feeds it and History).
"""

from etl.pipeline.artifacts import check_match
from etl.pipeline.core import ON_ERROR, OnError, Part, Pipeline, Rejected, Transformed

__all__ = ["ON_ERROR", "OnError", "Part", "Pipeline", "Rejected", "Transformed", "check_match"]
