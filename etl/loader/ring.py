"""A preallocated ring of batch slots: host tensors (pinned when CUDA is present) and, for a CUDA device, device
tensors filled by asynchronous copies on a side stream.

Life of a slot: the producer ``acquire``s a free slot, ``fill``s its host tensors from numpy arrays, and
``ship``s it: on CUDA the host→device copy is queued with ``non_blocking=True`` on the side stream and an event
is recorded after it. The consumer ``wait``s for that event on its own stream (the GPU waits, not the CPU) and
uses the tensors until it ``release``s the slot; the release records an event on the consumer's stream that
the next copy into the slot waits for, so a slot is never overwritten while the training step still reads it.
Slots are allocated once and reused batch after batch.

A ring may also hold ``outputs``: device tensors per slot that no copy fills, written by a function ``ship`` runs
on the side stream right after the copy (the device part of a pipeline, see ``etl.loader.device_stage``); the event the
consumer waits for is recorded after it. Inputs already on the device are written by that function itself
(``ship(copy=False)``), with no copy.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Field:
    """One fixed-shape field of a batch: ``shape`` excludes the batch dimension."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class Ring:
    def __init__(self, slots: int, batch_size: int, fields: list[Field], device: torch.device, outputs: tuple[Field, ...] = ()):
        self.device = device
        self.cuda = device.type == "cuda"
        self.fields = fields
        pin = self.cuda and torch.cuda.is_available()
        self.host = [{f.name: torch.empty((batch_size, *f.shape), dtype=f.dtype, pin_memory=pin) for f in fields} for _ in range(slots)]
        self.dev = [{k: torch.empty_like(v, device=device) for k, v in h.items()} for h in self.host] if self.cuda else self.host
        self.out = [{f.name: torch.empty((batch_size, *f.shape), dtype=f.dtype, device=device) for f in outputs} for _ in range(slots)]
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        self.copied: list[torch.cuda.Event | None] = [None] * slots  # event recorded after each slot's host→device copy
        # event recorded on the consumer's stream when it released the slot
        self.released: list[torch.cuda.Event | None] = [None] * slots
        self.free: queue.Queue[int] = queue.Queue()
        for i in range(slots):
            self.free.put(i)

    def acquire_free(self) -> int:
        """A free slot, waiting as long as it takes (for a caller that releases every slot it takes)."""
        return self.free.get()

    def acquire(self, stop: threading.Event) -> int | None:
        """A free slot, or None once ``stop`` is set."""
        while not stop.is_set():
            try:
                return self.free.get(timeout=0.05)
            except queue.Empty:
                continue
        return None

    def write(self, slot: int, n: int) -> dict[str, np.ndarray]:
        """Numpy views of the first ``n`` rows of the slot's host tensors, to be filled by the caller (returned
        once the slot's previous host→device copy, which reads them, has finished)."""
        copied = self.copied[slot]
        if copied is not None:
            copied.synchronize()
        return {name: t[:n].numpy() for name, t in self.host[slot].items()}

    def fill(self, slot: int, arrays: dict[str, np.ndarray], n: int) -> None:
        """Copy the first ``n`` rows of each field from numpy into the slot's host tensors."""
        for name, view in self.write(slot, n).items():
            np.copyto(view, arrays[name])

    def ship(self, slot: int, n: int, then: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]], Any] | None = None,
             *, copy: bool = True) -> Any:  # fmt: skip
        """Start the host→device copy of the slot's first ``n`` rows (CUDA only), then run ``then(inputs,
        outputs)`` on the same stream with the slot's device inputs and output tensors (first ``n`` rows), if
        given; returns what ``then`` returns. ``copy=False``: no copy, ``then`` fills the device inputs itself
        (from data already on the device)."""
        inputs = {k: v[:n] for k, v in self.dev[slot].items()}
        outputs = {k: v[:n] for k, v in self.out[slot].items()}
        if not self.cuda:
            return then(inputs, outputs) if then is not None else None
        stream, released = self.stream, self.released[slot]
        if stream is None:
            raise RuntimeError("a CUDA ring has a copy stream")
        with torch.cuda.stream(stream):
            if released is not None:
                stream.wait_event(released)
            for name, h in self.host[slot].items() if copy else ():
                self.dev[slot][name][:n].copy_(h[:n], non_blocking=True)
            result = then(inputs, outputs) if then is not None else None
            event = torch.cuda.Event()
            event.record(self.stream)
            self.copied[slot] = event
        return result

    def view(self, slot: int, n: int) -> dict[str, torch.Tensor]:
        """The slot's tensors (inputs and outputs) on the target device, first ``n`` rows, once the consumer's
        stream may use them."""
        copied = self.copied[slot]
        if copied is not None:  # set by ship on CUDA
            torch.cuda.current_stream(self.device).wait_event(copied)
        return {name: t[:n] for name, t in (self.dev[slot] | self.out[slot]).items()}

    def reclaim(self) -> None:
        """Mark every slot free again (between iterations, when no batch of the ring is in use any more)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()
        while not self.free.empty():
            self.free.get_nowait()
        for i in range(len(self.host)):
            self.free.put(i)

    def release(self, slot: int) -> None:
        """The consumer is done with the slot's tensors (work already queued on its stream may still read them)."""
        if self.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.released[slot] = event
        self.free.put(slot)
