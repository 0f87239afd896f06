"""The device-placement stages of ``etl bench`` (``--transform-on device``): where the time goes when the
pipeline's device part runs after the host→device copy (``etl.loader.device_stage``).

One thread, row groups already in memory, batches of ``batch_size`` rows, best of two passes. Every stage is
named ``dp:<stage>`` (device placement):

- ``host part``: Arrow → columns, the label check and the host ops (decoding text to keys);
- ``inputs``: laying the result out as the slot's fixed-width inputs, shuffle-free concatenation into batches;
- ``ring``: copying each batch into a (pinned, on CUDA) slot;
- ``h2d``: the slot's host→device copy (CUDA only);
- ``columns``: the slot's inputs as one contiguous column each (a transpose per field);
- ``<i>:<op>``: each op of the device part, on the device (synchronised before and after on CUDA);
- ``output``: the output check and writing the loader's ``label``/``dense``/``sparse`` fields.
"""

from __future__ import annotations

import time

import pyarrow as pa
import torch

from etl.io.parquet import batch_from_arrow
from etl.loader.chunk import Chunk, Layout
from etl.loader.device_stage import DeviceStage
from etl.loader.ring import Ring
from etl.pipeline import Pipeline


def measure_device_stages(pipeline: Pipeline, tables: list[pa.Table], batch_size: int, device: torch.device) -> list[tuple[str, float]]:
    """(stage name, seconds) for every stage of the module docstring, best of two passes."""
    stage = DeviceStage(pipeline, Layout.of(pipeline), [])
    passes = [_device_pass(pipeline, stage, tables, batch_size, device) for _ in range(2)]
    return [(f"dp:{name}", min(p[name] for p in passes)) for name in passes[0]]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_pass(pipeline: Pipeline, stage: DeviceStage, tables: list[pa.Table], batch_size: int, device: torch.device) -> dict[str, float]:
    spent: dict[str, float] = {"host part": 0.0}
    chunks = []
    for table in tables:
        t0 = time.perf_counter()
        host = pipeline.transform(batch_from_arrow(table, pipeline.schema), part="host").batch
        spent["host part"] += time.perf_counter() - t0
        chunks.append(stage.inputs.chunk(host, 0, 0))
    t0 = time.perf_counter()
    whole = Chunk.concat(chunks)
    batches = [whole.slice(a, min(a + batch_size, whole.n)) for a in range(0, whole.n, batch_size)]
    spent["inputs"] = time.perf_counter() - t0
    _, device_ops = pipeline.split()
    spent |= {"ring": 0.0, **({"h2d": 0.0} if device.type == "cuda" else {}), "columns": 0.0}
    spent |= {f"{i}:{op.name}": 0.0 for i, op in enumerate(device_ops)} | {"output": 0.0}
    ring = Ring(1, batch_size, stage.inputs.fields(), device, stage.outputs())
    for b in batches:
        slot = ring.acquire_free()
        t0 = time.perf_counter()
        ring.fill(slot, b.fixed, b.n)
        t1 = time.perf_counter()
        inputs, out = ring.ship(slot, b.n, lambda i, o: (i, o))
        ring.view(slot, b.n)
        _sync(device)
        t2 = time.perf_counter()
        spent["ring"] += t1 - t0
        if "h2d" in spent:
            spent["h2d"] += t2 - t1
        batch = stage.batch(inputs, b.lists)
        _sync(device)
        spent["columns"] += time.perf_counter() - t2
        for i, op in enumerate(device_ops):
            _sync(device)
            t0 = time.perf_counter()
            batch = batch.with_columns(op.transform(batch, stage.xp))
            _sync(device)
            spent[f"{i}:{op.name}"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        pipeline.check_output(batch, stage.xp)
        stage.write(batch, out)
        _sync(device)
        spent["output"] += time.perf_counter() - t0
        ring.release(slot)
    return spent
