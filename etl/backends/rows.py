"""Row copies between row-major arrays ([n, k]: the loader's chunks, shuffle buffers and batch slots), as a numba
kernel that releases the GIL (``nogil=True``), so that the loader's assembler thread copies while worker threads
run Python. Each row is one ``memcpy`` of its bytes, as numpy's ``take`` along axis 0 copies it."""

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
    for r in range(len(src_rows)):
        _copy_row(out, out_rows[r], src, src_rows[r], nbytes)


def scatter_rows(src: np.ndarray, src_rows: np.ndarray, out: np.ndarray, out_rows: np.ndarray) -> None:
    """``out[out_rows[r]] = src[src_rows[r]]`` for every r: one copy of each row, without the intermediate array
    that ``out[out_rows] = src[src_rows]`` makes. ``src`` and ``out``: 1-d or 2-d arrays of one dtype and row
    width, each row contiguous in memory. The row numbers (int64) must be in range: they are not checked, for
    speed; ``ValueError`` is raised for arrays that do not fit these rules."""
    if src.ndim == 1:
        src = src.reshape(-1, 1)
    if out.ndim == 1:
        out = out.reshape(-1, 1)
    row_bytes = src.shape[1] * src.itemsize
    fits = src.dtype == out.dtype and src.shape[1] == out.shape[1] and len(src_rows) == len(out_rows)
    if not (fits and src.ndim == out.ndim == 2 and _contiguous_rows(src) and _contiguous_rows(out)):
        raise ValueError(f"cannot copy rows of {src.dtype}{list(src.shape)} into {out.dtype}{list(out.shape)} "
                         f"({len(src_rows)} source rows, {len(out_rows)} destination rows; rows must be contiguous)")  # fmt: skip
    _scatter_rows(src, src_rows.astype(np.int64, copy=False), out, out_rows.astype(np.int64, copy=False), row_bytes)


def _contiguous_rows(a: np.ndarray) -> bool:
    """Whether each row of the 2-d array ``a`` is one run of ``a.shape[1] * a.itemsize`` bytes, the rows one
    after the other."""
    row_bytes = a.shape[1] * a.itemsize
    return (a.shape[1] <= 1 or a.strides[1] == a.itemsize) and (a.shape[0] <= 1 or row_bytes == 0 or a.strides[0] == row_bytes)
