"""``etl preprocess`` with a split (``etl.pipeline.split``): ``OUT/train``, ``OUT/valid`` and ``OUT/test``, every
statistic fitted on the train rows only.

1. Resolve the split (``etl.preprocess.split_pass``): no pass for a split by time with fixed bounds; one pass over
   the split columns for quantile bounds or each key's latest events.
2. Each split is then written to the subdirectory of its name, train first, as ``etl preprocess`` writes an output
   (``etl.preprocess.run.write_output``: resumable, manifest, checksums, quarantine, row accounting, threads or a
   Dask cluster), the pipeline's row-scope stages followed by a ``Split`` stage (``etl.pipeline.split_rows``) that
   passes on that split's rows. So the fit, which runs with the train split (in its single pass, in threads),
   sees the train rows only: every vocabulary (and its counts), normalisation and quantile is the train rows'; the
   valid and test rows are transformed with it (values unseen in train take the out-of-vocabulary and missing ids
   as each op defines them). Each split's row accounting counts the rows of the other splits as removed by its
   ``Split`` stage: ``rows_in = rows_out + rows_quarantined + rows removed`` holds per split.
3. With History (a keyed step, ``etl.preprocess.keyed``), the fit runs first, on the train rows; each split is then
   written through the exchange by key of every row, so History sees the whole timeline (a test row's history holds
   the earlier events of every split, never its own or later ones), and the ``Split`` stage is applied to History's
   output: the split's manifest lists it before History, which then counts the split's rows only.
4. For the valid and test splits, a pass over the rows counts the values the train vocabularies lack
   (``etl.preprocess.cold_start``); each split's manifest gets its ``SplitReport`` (its rule, rows, unseen values).

The artifacts are fitted once and saved in each split's directory (the same bytes in each), so each split is a
processed output that ``etl inspect`` and the ``Loader`` read as any other. Their pipeline document records the
split (as given). The shards are read: once for a split by time with fixed bounds, else twice, then once per split
(the train split's fit and transform share a read, without History), and once more per valid or test split for
its unseen values.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from etl.errors import ConfigError, OutputError
from etl.io.fs import Location
from etl.io.lock import locked
from etl.io.processed import SPLITS, SplitReport, StageRows, is_processed, read_manifest, sum_stages, write_manifest
from etl.pipeline import Pipeline
from etl.pipeline.split import parse_split, split_option
from etl.pipeline.split_rows import Assignment, SplitStage
from etl.preprocess.cold_start import unseen_in_train
from etl.preprocess.output import check_apart
from etl.preprocess.run import RunSettings, SplitPart, Summary, write_output
from etl.preprocess.split_pass import resolve
from etl.runtime.progress import Progress


def preprocess_split(pipeline: Pipeline, split: Mapping[str, Any] | str | None, run: RunSettings, artifacts: Location | None, budget: int,
                     formats: tuple[str, ...], npy_chunk_rows: int) -> Summary:  # fmt: skip
    """``etl preprocess`` of ``pipeline`` with ``split`` (a split section, or ``--split``'s text; None: the
    pipeline's own) into the subdirectories of ``run.out_dir`` (see the module docstring); the other arguments as
    ``etl.preprocess.preprocess`` takes them, checked. ``ConfigError`` for ``artifacts`` or a fitted pipeline (its
    statistics would not be the train rows' of this split), ``OutputError`` when ``run.out_dir`` holds an output
    without a split, or a valid split that this split does not write."""
    if artifacts is not None or (pipeline.is_fitted and any(op.fittable for op in pipeline.ops)):
        raise ConfigError("a split run fits its statistics on its train rows: it takes no fitted artifacts (leave out --artifacts)")
    if run.training is not None:
        raise ConfigError("a split run transforms its train rows as training rows and the other splits' rows not: it takes no "
                          "--training/--no-training")  # fmt: skip
    if split is not None:
        doc = split_option(split) if isinstance(split, str) else dict(split)
        parse_split(doc, pipeline.schema, "--split" if isinstance(split, str) else "split argument")  # named as given
        pipeline = Pipeline({**pipeline.doc, "split": doc}, pipeline.schema, pipeline.path, pipeline.xp)
    spec = pipeline.split_spec
    if spec is None:
        raise ValueError("no split to run")
    out_dir = run.out_dir
    check_apart(out_dir, run.shards)
    out_dir.mkdir(parents=True, exist_ok=True)
    with locked(out_dir):
        if is_processed(out_dir):
            raise OutputError(f"{out_dir}: holds the output of a run without a split; a split run writes {', '.join(spec.roles)} under it: choose "
                              "another --out")  # fmt: skip
        stale = [role for role in SPLITS if role not in spec.roles and is_processed(out_dir / role)]
        if stale:
            raise OutputError(f"{out_dir / stale[0]}: holds the {stale[0]} split of an earlier run; this split has none: remove it or choose "
                              "another --out")  # fmt: skip
        assignment = resolve(pipeline, spec, run.shards, run.workers, run.progress)
        inputs = {str(p): i for i, p in enumerate(run.shards)}
        keyed = any(op.keyed for op in pipeline.ops)
        fit_seconds = None
        if keyed:  # the exchange transforms every row: the fit, on the train rows, comes first
            t1 = time.perf_counter()
            staged = pipeline.with_stages([*pipeline.stages, SplitStage(assignment, "train", inputs)])
            staged.fit(run.shards, workers=run.workers, on_error=run.on_error, progress=run.progress, client=run.client,
                       partitions=run.partitions, workdir=out_dir if run.client is not None else None)  # fmt: skip
            fit_seconds = time.perf_counter() - t1
        parts = [_write_split(pipeline, assignment, role, inputs, run, budget, formats, npy_chunk_rows, keyed, training=role == "train")
                 for role in spec.roles]  # fmt: skip
        return _summary(parts, fit_seconds, tuple(pipeline.fit_warnings))


def _write_split(pipeline: Pipeline, assignment: Assignment, role: str, inputs: dict[str, int], run: RunSettings, budget: int,
                 formats: tuple[str, ...], npy_chunk_rows: int, keyed: bool, *, training: bool) -> SplitPart:  # fmt: skip
    """Write split ``role`` (``assignment`` places the rows; ``inputs``: the index of each shard by its path) of
    ``pipeline`` to ``run.out_dir / role``, and its report into its manifest. Without a keyed step the pipeline
    runs with the ``Split`` stage last among its stages (the train split's run fits it, unless ``keyed``: fitted
    already); with one it transforms every row and the stage routes History's output.

    ``training``: whether these rows are the training rows (the train split, whose rows the statistics were fitted
    on) rather than rows the model is evaluated on (valid, test): they are transformed so
    (``Pipeline.transform(..., training=...)``: TargetEncode's out-of-fold encodings for train only), and the values
    an evaluation split holds that train's vocabularies lack are counted for its report (a training split holds none
    by construction)."""
    stage = SplitStage(assignment, role, inputs)
    directory = run.out_dir / role
    progress = None if run.progress is None else _passes_of(run.progress, role)
    routed = replace(run, out_dir=directory, split_stage=stage, progress=progress, training=training)
    summary = write_output(pipeline if keyed else pipeline.with_stages([*pipeline.stages, stage]), routed, None, budget, formats, npy_chunk_rows)
    unseen = () if training else unseen_in_train(pipeline, assignment, role, run.shards, run.workers, progress)
    placed = [s.rows_out for s in summary.stages or () if s.stage == stage.name]
    report = SplitReport(role, assignment.describe(role), placed[0], unseen)
    write_manifest(directory, replace(read_manifest(directory), split=report))
    return SplitPart(role, directory, summary, report)


def _passes_of(progress: Progress, role: str) -> Progress:
    """``progress`` hearing of the passes of split ``role`` by their names prefixed with it (``"valid transform"``)."""
    return lambda name, rows: progress(f"{role} {name}", rows)


def _summary(parts: list[SplitPart], fit_seconds: float | None, warnings: tuple[str, ...]) -> Summary:
    """The summary of a split run: the rows read (once), those written and quarantined in all the splits, and the
    stages as one run over every row would count them (the row-scope ones as each split counts them, the
    ``Split`` stage left out, History's rows summed over the splits); ``splits``: each split's. ``fit_seconds``:
    the fit's, when it ran before the splits (else the train split's); ``warnings``: the fit's."""
    train = parts[0].summary
    stages = [s.summary.stages or () for s in parts]
    cut = [next(k for k, r in enumerate(per) if r.stage == SplitStage.name) for per in stages]
    after = sum_stages([per[k + 1 :] for per, k in zip(stages, cut)]) if any(len(per) > k + 1 for per, k in zip(stages, cut)) else None
    combined: tuple[StageRows, ...] = (*stages[0][: cut[0]], *(after or ()))
    return Summary(
        files=train.files,
        files_skipped=sum(p.summary.files_skipped for p in parts),
        rows_in=train.rows_in,
        rows_out=sum(p.summary.rows_out for p in parts),
        rows_quarantined=sum(p.summary.rows_quarantined for p in parts),
        rows_processed=max(p.summary.rows_processed for p in parts),  # every split reads every row: counted once
        fit_seconds=fit_seconds if fit_seconds is not None else train.fit_seconds,
        transform_seconds=sum(p.summary.transform_seconds for p in parts),
        stash_peak_bytes=train.stash_peak_bytes,
        stash_spilled_bytes=train.stash_spilled_bytes,
        memory_budget=train.memory_budget,
        stages=combined or None,
        warnings=warnings,
        splits=tuple(parts),
    )
