"""The id convention every id-producing op follows (Hash, Categorify, HashedCross, Bucketize).

- ``PAD`` (0): padding, for list columns padded to a fixed length by a consumer; no op emits it for a value;
- ``MISSING`` (1): the value was missing (null in the source, or made missing by an op);
- ``FIRST`` (2) onwards: the op's own ids (hash buckets; Categorify's out-of-vocabulary buckets, then its
  vocabulary; Bucketize's buckets).

A column's cardinality (its embedding table size) counts the reserved ids: ``FIRST + ids of the op``. Ids are
stored as int32 when every id fits, else int64 (``id_dtype``).
"""

from __future__ import annotations

import numpy as np

PAD = 0
MISSING = 1
FIRST = 2
RESERVED = FIRST  # ids below FIRST are reserved: PAD and MISSING

DESCRIPTION = "0 = padding, 1 = missing, 2.. = op ids (Hash: buckets; Categorify: OOV buckets then vocabulary by count desc, key asc)"


def id_dtype(cardinality: int) -> np.dtype:
    """int32 when every id (0 .. cardinality - 1) fits, else int64."""
    return np.dtype(np.int32) if cardinality - 1 <= np.iinfo(np.int32).max else np.dtype(np.int64)
