"""The plan of a fit: the stages its ops are fitted in, and for each stage the fitted ops that feed it and the
columns to read. Shared by the threaded executor (``etl.pipeline.fit``), the single pass
(``etl.pipeline.single_pass``) and the Dask executor (``etl.pipeline.distributed``).

Ops are fitted in stages: a stage is every unfitted op whose inputs do not depend on another unfitted op (an op
that reads what an unfitted op writes waits for a later stage).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etl.ops import Op

if TYPE_CHECKING:
    from etl.pipeline.core import Pipeline


def stage_name(k: int, stages: int) -> str:
    """The progress pass name of fitting stage ``k`` of ``stages``: ``"fit"``, or ``"fit 1/2"``, ``"fit 2/2"``...
    with several stages."""
    return "fit" if stages == 1 else f"fit {k + 1}/{stages}"


def fit_stages(ops: list[Op]) -> list[list[Op]]:
    """The stages that fit the unfitted ops of ``ops``, in order: each is every op not yet fitted (by then) whose
    inputs do not depend on another such op, in pipeline order."""
    done = {id(op) for op in ops if op.is_fitted}
    stages = []
    while len(done) < len(ops):
        stale: set[str] = set()
        stage = []
        for op in ops:
            if stale & set(op.columns):
                stale |= set(op.outputs)
            elif id(op) not in done:
                stage.append(op)
                stale |= set(op.outputs)
        stages.append(stage)
        done |= {id(op) for op in stage}
    return stages


def fit_plan(pipeline: Pipeline, stage: list[Op]) -> tuple[list[Op], list[str]]:
    """What fitting ``stage`` needs: the fitted ops that feed it, in pipeline order, and the columns to read
    (theirs, the stage's, the labels, Groupby's key and the ops' source columns: rows without a label or key are
    skipped by fit as by transform, ``Pipeline.check_labels``).

    An op that does not depend on an unfitted op never writes a column a stage op reads (ops write in place
    what they read, or new columns), so all of them can run before the stage ops gather statistics."""
    needed = set(pipeline.schema.by_role("label"))
    feeding = []
    for op in reversed(pipeline.ops):
        if op in stage or needed & set(op.outputs):
            feeding.append(op)
            needed |= set(op.columns)
    stale: set[str] = set()
    prep = []
    for op in feeding[::-1]:
        if op in stage or stale & set(op.columns):
            stale |= set(op.outputs)
        else:
            prep.append(op)
    read = needed | set(pipeline.groupby.by if pipeline.groupby is not None else [])  # checked as read, before any op
    read |= {c for op in pipeline.ops for c in op.source_columns()}  # History's key and time: Op.check_sources
    return prep, [c for c in pipeline.schema.names if c in read]
