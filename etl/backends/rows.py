"""Row copies between row-major arrays ([n, k]: the loader's chunks, shuffle buffers and batch slots), as numba
kernels that release the GIL (``nogil=True``), so that the loader's assembler thread copies while worker threads
run Python. Each row is one ``memcpy`` of its bytes, as numpy's ``take`` along axis 0 copies it.

``split_rows`` sorts row numbers of a run of arrays (rows ``starts[k]:starts[k + 1]`` in array k) by array, and
``scatter_rows`` copies each array's share, so that rows are gathered from several arrays without
concatenating them first."""

from __future__ import annotations

import numba as nb
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic


@intrinsic
def _copy_row(typingctx, out, o, src, s, nbytes):
    """``out[o, :] = src[s, :]`` as one memcpy of ``nbytes`` bytes (both arrays hold rows of that many contiguous
    bytes; ``scatter_rows`` checks it)."""
    if not (isinstance(out, types.Array) and isinstance(src, types.Array)):
        return None
    sig = types.void(out, o, src, s, nbytes)

    def codegen(context, builder, signature, args):
        outty, _, srcty, _, _ = signature.args
        outa = context.make_array(outty)(context, builder, args[0])
        srca = context.make_array(srcty)(context, builder, args[2])
        zero = context.get_constant(types.intp, 0)
        dst = cgutils.get_item_pointer(context, builder, outty, outa, [args[1], zero], wraparound=False, boundscheck=False)
        ptr = cgutils.get_item_pointer(context, builder, srcty, srca, [args[3], zero], wraparound=False, boundscheck=False)
        cgutils.raw_memcpy(builder, dst, ptr, args[4], 1)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(nogil=True, cache=True)
def _scatter_rows(src, src_rows, out, out_rows, nbytes):
    """Copy the rows; the first r whose row numbers are out of range (nothing copied from it on), or -1."""
    for r in range(len(src_rows)):
        s, o = src_rows[r], out_rows[r]
        if s < 0 or s >= src.shape[0] or o < 0 or o >= out.shape[0]:
            return r
        _copy_row(out, o, src, s, nbytes)
    return -1


@nb.njit(nogil=True, cache=True)
def _scatter_items(src, src_rows, out, out_rows):
    """``_scatter_rows`` for 1-d arrays: ``out[out_rows[r]] = src[src_rows[r]]``; the first r out of range, or -1."""
    for r in range(len(src_rows)):
        s, o = src_rows[r], out_rows[r]
        if s < 0 or s >= len(src) or o < 0 or o >= len(out):
            return r
        out[o] = src[s]
    return -1


def scatter_rows(src: np.ndarray, src_rows: np.ndarray, out: np.ndarray, out_rows: np.ndarray) -> None:
    """``out[out_rows[r]] = src[src_rows[r]]`` for every r: one copy of each row, without the intermediate array
    that ``out[out_rows] = src[src_rows]`` makes. ``src`` and ``out``: 1-d or 2-d arrays of one dtype and row
    width, each row contiguous in memory (``ValueError`` otherwise). A row number out of range raises
    ``IndexError`` (the rows before it are copied)."""
    if src.ndim == 1:
        src = src.reshape(-1, 1)
    if out.ndim == 1:
        out = out.reshape(-1, 1)
    row_bytes = src.shape[1] * src.itemsize
    fits = src.dtype == out.dtype and src.shape[1] == out.shape[1] and len(src_rows) == len(out_rows)
    if not (fits and src.ndim == out.ndim == 2 and _contiguous_rows(src) and _contiguous_rows(out)):
        raise ValueError(f"cannot copy rows of {src.dtype}{list(src.shape)} into {out.dtype}{list(out.shape)} "
                         f"({len(src_rows)} source rows, {len(out_rows)} destination rows; rows must be contiguous)")  # fmt: skip
    src_rows, out_rows = src_rows.astype(np.int64, copy=False), out_rows.astype(np.int64, copy=False)
    if src.shape[1] == 1:  # rows of one element: copied as elements (a memcpy call per element costs more)
        bad = _scatter_items(src[:, 0], src_rows, out[:, 0], out_rows)
    else:
        bad = _scatter_rows(src, src_rows, out, out_rows, row_bytes)
    if bad >= 0:
        raise IndexError(f"row {src_rows[bad]} of {len(src)} copied to row {out_rows[bad]} of {len(out)}")


def _contiguous_rows(a: np.ndarray) -> bool:
    """Whether each row of the 2-d array ``a`` is one run of ``a.shape[1] * a.itemsize`` bytes, the rows one
    after the other."""
    row_bytes = a.shape[1] * a.itemsize
    return (a.shape[1] <= 1 or a.strides[1] == a.itemsize) and (a.shape[0] <= 1 or row_bytes == 0 or a.strides[0] == row_bytes)


@nb.njit(nogil=True, cache=True)
def _split_rows(starts, rows, src_rows, out_rows, bounds):
    """Fill the three arrays; the first r whose row number is out of range (nothing filled), or -1."""
    parts = len(starts) - 1
    which = np.empty(len(rows), np.int64)
    for r in range(len(rows)):
        if rows[r] < 0 or rows[r] >= starts[parts]:
            return r
        k = 0
        while k + 1 < parts and rows[r] >= starts[k + 1]:
            k += 1
        which[r] = k
        bounds[k + 1] += 1
    for k in range(parts):
        bounds[k + 1] += bounds[k]
    fill = bounds[:-1].copy()
    for r in range(len(rows)):
        k = which[r]
        src_rows[fill[k]] = rows[r] - starts[k]
        out_rows[fill[k]] = r
        fill[k] += 1
    return -1


def split_rows(starts: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For row numbers ``rows`` of a run of arrays (array k holds rows ``starts[k]:starts[k + 1]``; ``starts``
    int64, ascending, from 0): ``(src_rows, out_rows, bounds)``, where ``src_rows[bounds[k]:bounds[k + 1]]`` are
    the rows of array k (numbered within it) that ``rows`` names, at positions ``out_rows[bounds[k]:bounds[k + 1]]``
    of ``rows``, in the order of ``rows``. A row number outside ``[0, starts[-1])`` raises ``IndexError``."""
    rows = rows.astype(np.int64, copy=False)
    src_rows = np.empty(len(rows), np.int64)
    out_rows = np.empty(len(rows), np.int64)
    bounds = np.zeros(len(starts), np.int64)
    bad = _split_rows(starts.astype(np.int64, copy=False), rows, src_rows, out_rows, bounds)
    if bad >= 0:
        raise IndexError(f"row {rows[bad]} of a run of {starts[-1]} rows")
    return src_rows, out_rows, bounds
