"""Naive hand-written versions of the two Criteo pipelines, for benchmarks that compare the same work.

Each baseline is what a user might write in an afternoon with one library, without ``etl``:

- ``polars_categorify`` / ``polars_hash`` (in ``etl.bench.polars_baselines``, which also runs them as a process):
  polars expressions (``group_by().len()`` for the vocabularies, ``replace_strict`` for the lookup; polars' own
  hash for the hash pipeline).
- ``numpy_categorify`` / ``numpy_hash``: ``pyarrow.parquet.read_table`` plus numpy (``np.unique`` for the
  vocabularies, ``np.searchsorted`` for the lookup; etl's documented hash in numpy uint64 arithmetic).

They all read Criteo-layout raw shards (``label``, ``I1..I13`` int64, ``C1..C26`` 8-hex-digit strings; see
``schemas/criteo.yaml``) and write one Parquet file per input file, ``part-00000.parquet``, ``part-00001.parquet``,
... (input order) with the columns ``label`` (float32), ``I1..I13`` (float32), ``C1..C26`` (int32), in that order,
each with the library's default Parquet writer settings.

Shared semantics (those of ``pipelines/criteo.yaml`` and ``pipelines/criteo_hash.yaml``):

- label → float32;
- dense: ``float32(ln(1 + max(fill0(x), 0)))``, computed in float64 and rounded once;
- ids: 0 padding (never produced), 1 missing, 2.. the op's ids.

``polars_categorify``, ``numpy_categorify`` and ``numpy_hash`` produce output equal to etl's, value for value;
``polars_hash`` does the same work but with polars' hash, so its ids differ from etl's by construction.
``same_output`` / ``first_difference`` compare two output directories.

These are deliberately simple: whole files in memory, no threads, no validation beyond what the libraries do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from etl.backends.hashing import check_buckets, hash64_array
from etl.bench.polars_baselines import CATS, DENSE, FIRST_VOCAB_ID, LABEL, OOV_ID, PathLike
from etl.ids import FIRST, MISSING
from etl.io.files import is_shard_name, shard_index, shard_name


def _part(out_dir: Path, i: int) -> Path:
    return out_dir / shard_name(i)


# ==================================================================== pyarrow + numpy

# ASCII byte → hex digit value; 255 marks a byte that is not a hex digit (either case accepted).
_HEX = np.full(256, 255, np.uint8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)


def hex8_keys(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Decode a string column of 8-hex-digit values (either case) to ``(keys uint64, valid bool)``.

    Missing values get key 0 and ``valid`` False. Any present value that is not exactly 8 hex digits raises
    ``ValueError``. Vectorised over the Arrow buffers (offsets + character data), no per-row Python."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_string_view(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.string())
    if not pa.types.is_string(arr.type):
        raise TypeError(f"expected a string column, got {arr.type}")
    n = len(arr)
    valid = np.ones(n, bool) if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32)[arr.offset : arr.offset + n + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    if not (lengths[valid] == 8).all():
        raise ValueError("malformed value (expected 8 hex digits)")
    if (lengths[~valid] == 0).all():
        # present values are 8 bytes each and back to back: view them as an (m, 8) block
        chars = data[offsets[0] : offsets[-1]].reshape(-1, 8)
    else:
        chars = data[offsets[:-1][valid][:, None] + np.arange(8)]
    nibbles = _HEX[chars]
    if (nibbles == 255).any():
        raise ValueError("malformed value (expected 8 hex digits)")
    packed = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])  # (m, 4) bytes, big-endian
    keys = np.zeros(n, np.uint64)
    keys[valid] = packed.view(">u4").ravel()
    return keys, valid


def _dense_arrays(table: pa.Table) -> list[pa.Array]:
    """label → float32; I1..I13 → float32(log1p(max(fill0(x), 0))) computed in float64."""
    out = [pa.array(table.column(LABEL).to_numpy().astype(np.float32))]
    for c in DENSE:
        x = pc.fill_null(table.column(c), 0).to_numpy().astype(np.float64)
        out.append(pa.array(np.log1p(np.maximum(x, 0.0)).astype(np.float32)))
    return out


_OUTPUT_SCHEMA = pa.schema([(c, pa.float32()) for c in [LABEL, *DENSE]] + [(c, pa.int32()) for c in CATS])


def _write(arrays: list[pa.Array], path: Path) -> None:
    pq.write_table(pa.Table.from_arrays(arrays, schema=_OUTPUT_SCHEMA), path)


def numpy_categorify(files: Sequence[PathLike], out_dir: PathLike, freq_threshold: int = 3) -> None:
    """Criteo categorify pipeline in pyarrow + numpy (fit + transform), whole files in memory.

    Fit: for every file and categorical column, ``np.unique(keys, return_counts=True)`` over the decoded hex keys
    of the present values; the per-file counts are summed over all files (another ``np.unique`` on the
    concatenated keys, ``np.bincount`` of the counts). Keys seen at least ``freq_threshold`` times form the
    vocabulary, ordered by count descending, ties by key ascending; they get ids 3, 4, ...
    Transform: ``np.searchsorted`` on the (ascending) vocabulary keys; missing → 1; a key not in the vocabulary → 2.

    This is exactly etl's ``Categorify`` with ``oov_buckets=1`` (every unknown key gets the single OOV id 2), so
    the output equals ``pipelines/criteo.yaml``'s value for value."""
    paths = [Path(f) for f in files]
    out = Path(out_dir)
    # ---- fit
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {c: [] for c in CATS}
    for f in paths:
        table = pq.read_table(f, columns=CATS)
        for c in CATS:
            keys, valid = hex8_keys(table.column(c))
            parts[c].append(np.unique(keys[valid], return_counts=True))
    vocab: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # column → (ascending keys, their ids)
    for c in CATS:
        uniq, inverse = np.unique(np.concatenate([k for k, _ in parts[c]]), return_inverse=True)
        counts = np.bincount(inverse, weights=np.concatenate([n for _, n in parts[c]]), minlength=len(uniq)).astype(np.int64)
        keep = counts >= freq_threshold
        keys, counts = uniq[keep], counts[keep]  # still ascending by key
        order = np.lexsort((keys, -counts))  # vocabulary order: count desc, key asc
        ids = np.empty(len(keys), np.int32)
        ids[order] = np.arange(FIRST_VOCAB_ID, FIRST_VOCAB_ID + len(keys), dtype=np.int32)
        vocab[c] = (keys, ids)
    del parts
    # ---- transform

    def vocabulary_ids(c: str, keys: np.ndarray, valid: np.ndarray) -> np.ndarray:
        vkeys, vids = vocab[c]
        if len(vkeys):
            pos = np.minimum(np.searchsorted(vkeys, keys), len(vkeys) - 1)
            ids = np.where(vkeys[pos] == keys, vids[pos], np.int32(OOV_ID))
        else:
            ids = np.full(len(keys), OOV_ID, np.int32)
        ids[~valid] = MISSING
        return ids

    _numpy_transform(paths, out, vocabulary_ids)


def _numpy_transform(files: list[Path], out: Path, ids_of: Callable[[str, np.ndarray, np.ndarray], np.ndarray]) -> None:
    """Per file: read with pyarrow, the dense path, ``ids_of(column, keys, valid)`` for each categorical column."""
    out.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(files):
        table = pq.read_table(f)
        arrays = _dense_arrays(table)
        for c in CATS:
            keys, valid = hex8_keys(table.column(c))
            arrays.append(pa.array(ids_of(c, keys, valid)))
        _write(arrays, _part(out, i))


def numpy_hash_ids(keys: np.ndarray, valid: np.ndarray | None, num_buckets: int, seed: int = 0) -> np.ndarray:
    """etl's hash ids in numpy: ``2 + ((h >> 32) * n >> 32)`` with ``h = fmix64(key XOR seed_word(seed))``;
    missing (``valid`` False) → 1. Returns int32; bit-identical to ``etl.backends.hashing``."""
    check_buckets(num_buckets)
    h = hash64_array(keys, seed)
    s = np.uint64(32)
    bucket = ((h >> s) * np.uint64(num_buckets)) >> s  # < 2**63: exact in uint64
    ids = (bucket + np.uint64(FIRST)).astype(np.int32)
    if valid is not None:
        ids[~valid] = MISSING
    return ids


def numpy_hash(files: Sequence[PathLike], out_dir: PathLike, num_buckets: int = 40_000_000, seed: int = 0) -> None:
    """Criteo hash pipeline in pyarrow + numpy: decode the 8-hex-digit keys, then etl's documented hash
    (``numpy_hash_ids``: fmix64 with the seed word, multiply-shift reduction, id = 2 + bucket, missing → 1) in
    numpy uint64 arithmetic. Output equals ``pipelines/criteo_hash.yaml``'s bit for bit (40 M buckets, seed 0)."""
    _numpy_transform([Path(f) for f in files], Path(out_dir), lambda c, keys, valid: numpy_hash_ids(keys, valid, num_buckets, seed))


# ==================================================================== comparison


def _parts(d: Path) -> list[str]:
    return sorted((p.name for p in d.iterdir() if is_shard_name(p.name)), key=shard_index)


def first_difference(dir_a: PathLike, dir_b: PathLike) -> str | None:
    """``None`` when the part files (``part-*.parquet``) of two output directories hold the same values, else a
    one-line description of the first difference: a file missing on one side, column names or types (nullability
    and Parquet encoding are ignored), row counts, or the first differing row of the first differing column with
    both values. Values compare exactly (floats bit for bit; nulls equal only to nulls)."""
    a, b = Path(dir_a), Path(dir_b)
    names_a, names_b = _parts(a), _parts(b)
    if names_a != names_b:
        return f"part files differ: {a} has {names_a}, {b} has {names_b}"
    if not names_a:
        return f"no part files in {a} or {b}"
    for name in names_a:
        ta, tb = pq.read_table(a / name), pq.read_table(b / name)
        types_a = [(f.name, f.type) for f in ta.schema]
        types_b = [(f.name, f.type) for f in tb.schema]
        if types_a != types_b:
            return f"{name}: columns differ: {types_a} vs {types_b}"
        if ta.num_rows != tb.num_rows:
            return f"{name}: {ta.num_rows} rows vs {tb.num_rows}"
        for col in ta.column_names:
            ca, cb = ta.column(col).combine_chunks(), tb.column(col).combine_chunks()
            if ca.equals(cb) and _same_bits(ca, cb):
                continue
            null_a = ca.is_null().to_numpy(zero_copy_only=False)
            null_b = cb.is_null().to_numpy(zero_copy_only=False)
            va = ca.fill_null(0).to_numpy(zero_copy_only=False)
            vb = cb.fill_null(0).to_numpy(zero_copy_only=False)
            if va.dtype.kind == "f":
                va, vb = va.view(f"u{va.dtype.itemsize}"), vb.view(f"u{vb.dtype.itemsize}")
            diff = np.flatnonzero((null_a != null_b) | (~null_a & (va != vb)))
            if len(diff) == 0:
                continue  # equal bits that Array.equals calls different (NaN)
            r = int(diff[0])
            return f"{name}: column '{col}' row {r}: {ca[r].as_py()!r} vs {cb[r].as_py()!r} ({len(diff)} rows differ)"
    return None


def _same_bits(a: pa.Array, b: pa.Array) -> bool:
    """Float columns: ``Array.equals`` treats 0.0 and -0.0 as equal; compare the bits too."""
    if not pa.types.is_floating(a.type):
        return True
    va = a.fill_null(0).to_numpy(zero_copy_only=False)
    vb = b.fill_null(0).to_numpy(zero_copy_only=False)
    return bool(np.array_equal(va.view(f"u{va.dtype.itemsize}"), vb.view(f"u{vb.dtype.itemsize}")))


def same_output(dir_a: PathLike, dir_b: PathLike) -> bool:
    """True when two output directories hold the same part files with the same values (see ``first_difference``)."""
    return first_difference(dir_a, dir_b) is None
