"""DateParts against Python's datetime: every part of random and edge dates, in formats, as integers and text, and
as Unix seconds; invalid values reported for exactly the rows datetime refuses."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pytest

from etl.backends import cpu
from etl.batch import Batch
from etl.io.parquet import column_from_arrow
from etl.ops import DateParts, InvalidRows
from etl.schema import ColumnSpec

ALL = ["year", "month", "day", "hour", "minute", "weekday"]


def spec(name: str, dtype: str) -> ColumnSpec:
    return ColumnSpec(name, "categorical", dtype, "int" if dtype == "int64" else "string")


def run(values: list, dtype: str, fmt: str, parts: list[str] = ALL) -> dict[str, list]:
    """The op's output on a column ``t`` of ``values`` (None: missing), as {part: [int or None]}."""
    s = spec("t", dtype)
    op = DateParts(["t"], format=fmt, parts=parts)
    op.bind({"t": s})
    col = column_from_arrow(pa.array(values, pa.int64() if dtype == "int64" else pa.string()), s)
    out = op.transform(Batch({"t": col}, len(values)), cpu)
    assert list(out) == [f"t_{p}" for p in parts]
    res = {}
    for p in parts:
        c = out[f"t_{p}"]
        assert c.values.dtype == np.uint64
        res[p] = [None if c.valid is not None and not c.valid[i] else int(c.values[i]) for i in range(len(values))]
    return res


def render(d: datetime, fmt: str) -> str:
    """``d`` in ``fmt`` with every field zero-padded to its width (strftime leaves years before 1000 unpadded)."""
    fields = {"%Y": f"{d.year:04d}", "%y": f"{d.year % 100:02d}", "%m": f"{d.month:02d}", "%d": f"{d.day:02d}",
              "%H": f"{d.hour:02d}", "%M": f"{d.minute:02d}", "%S": f"{d.second:02d}", "%%": "%"}  # fmt: skip
    return re.sub("%.", lambda m: fields[m.group()], fmt)


def ref_date(value: int | str, fmt: str) -> datetime | None:
    """The date ``value`` stands for (None: not a date), by Python's datetime: Unix seconds (integer text: an
    optional sign and 1-19 ASCII digits), or ``strptime`` of the text (integers: zero-padded digits) when it has
    exactly the format's length in ASCII."""
    if fmt == "unix":
        if isinstance(value, str) and not re.fullmatch(r"[+-]?[0-9]{1,19}", value):
            return None
        try:
            return datetime.fromtimestamp(int(value), UTC).replace(tzinfo=None)
        except (ValueError, OverflowError, OSError):
            return None
    length = len(render(datetime(2000, 1, 1), fmt))
    if isinstance(value, int):
        if not 0 <= value < 10**length:
            return None
        value = f"{value:0{length}d}"
    if not value.isascii() or len(value) != length:
        return None
    try:
        return datetime.strptime(value, fmt)
    except ValueError:
        return None


def ref_parts(d: datetime) -> dict[str, int]:
    return {"year": d.year, "month": d.month, "day": d.day, "hour": d.hour, "minute": d.minute, "weekday": d.weekday()}


def check(values: list, dtype: str, fmt: str, parts: list[str]) -> None:
    """The op's parts of ``values`` are the reference's; or, when some value is not a date, the op reports exactly
    the rows the reference refuses."""
    want = [None if v is None else ref_date(v, fmt) for v in values]
    bad = [v is not None and d is None for v, d in zip(values, want)]
    if not any(bad):
        got = run(values, dtype, fmt, parts)
        for p in parts:
            assert got[p] == [None if d is None else ref_parts(d)[p] for d in want], p
        return
    with pytest.raises(InvalidRows) as e:
        run(values, dtype, fmt, parts)
    assert e.value.column == "t" and e.value.reason == f"not a date in format {fmt!r}"
    assert e.value.mask.tolist() == bad


def random_dates(n: int, seed: int, lo: int = 1, hi: int = 9999) -> list[datetime]:
    rng = random.Random(seed)
    a, b = datetime(lo, 1, 1).toordinal(), datetime(hi, 12, 31).toordinal()
    return [datetime.fromordinal(rng.randint(a, b)).replace(hour=rng.randrange(24), minute=rng.randrange(60), second=rng.randrange(60))
            for _ in range(n)]  # fmt: skip


def parts_in(fmt: str) -> list[str]:
    """The parts a format determines."""
    has = {"year": "%Y" in fmt or "%y" in fmt, "month": "%m" in fmt, "day": "%d" in fmt, "hour": "%H" in fmt, "minute": "%M" in fmt}
    return [p for p in ALL if has.get(p, has["year"] and has["month"] and has["day"])]


EDGES = [datetime(2000, 2, 29), datetime(1900, 3, 1, 23, 59), datetime(1, 1, 1), datetime(9999, 12, 31, 23, 59, 59)]


@pytest.mark.parametrize("fmt", ["%Y-%m-%d %H:%M:%S", "%Y%m%d%H%M", "%d/%m/%Y", "%y%m%d%H", "T%H:%M%%%Y.%m.%d"])
def test_text_in_formats(fmt: str) -> None:
    dates = [d for d in random_dates(1_000, 1) + EDGES if "%y" not in fmt or 1969 <= d.year <= 2068]
    parts = parts_in(fmt)
    check([render(d, fmt) for d in dates] + [None], "string", fmt, parts)


@pytest.mark.parametrize("fmt", ["%y%m%d%H", "%Y%m%d", "%Y%m%d%H%M%S", "%H%M"])
def test_integers_are_zero_padded_digits(fmt: str) -> None:
    """Avazu's hour column: int 14102100 is 2014-10-21 00h; the leading zeros an integer loses are restored."""
    dates = [d for d in random_dates(1_000, 2) + EDGES if "%y" not in fmt or 1969 <= d.year <= 2068]
    parts = parts_in(fmt)
    check([int(render(d, fmt)) for d in dates] + [None], "int64", fmt, parts)
    got = run([14102100, 1010100, 68123123, 69010100], "int64", "%y%m%d%H", ["year", "weekday", "hour"])
    assert got == {"year": [2014, 2001, 2068, 1969], "weekday": [1, 0, 0, 2], "hour": [0, 0, 23, 0]}


@pytest.mark.parametrize("dtype", ["int64", "string"])
def test_unix_seconds(dtype: str) -> None:
    rng = random.Random(3)
    lo, hi = -62_135_596_800, 253_402_300_799
    seconds = [lo, hi, 0, -1, 86_399, 86_400, 968_035_345, 951_782_400] + [rng.randint(lo, hi) for _ in range(2_000)]
    check([str(s) if dtype == "string" else s for s in seconds] + [None], dtype, "unix", ALL)
    got = run(["968035345" if dtype == "string" else 968_035_345], dtype, "unix")
    assert got == {"year": [2000], "month": [9], "day": [4], "hour": [2], "minute": [42], "weekday": [0]}


@pytest.mark.parametrize(
    "dtype,fmt,values",
    [
        ("string", "%Y-%m-%d", ["2014-02-28", "2014-02-29", "2016-02-29", "1900-02-29", "2000-02-29", "2014-12-31"]),
        ("string", "%Y-%m-%d", ["2014-13-01", "2014-00-10", "2014-04-31", "2014-04-00", "0000-01-01", "2014-04-30"]),
        ("string", "%Y-%m-%d", ["2014-1-05", " 2014-01-05", "2014-01-05 ", "2014/01/05", "２０１４-01-05", "", "2014-01-05"]),
        ("string", "%H:%M:%S", ["23:59:59", "24:00:00", "12:60:00", "12:00:60", "1a:00:00", "-1:00:00"]),
        ("string", "unix", ["0", "-62135596801", "253402300800", "1e9", "", "+5", "-0", "9223372036854775808", " 5", "5_0"]),
        ("int64", "unix", [-62135596800, -62135596801, 253402300799, 253402300800, -(2**63), 2**63 - 1]),
        ("int64", "%Y%m%d", [20140229, 20160229, -20160229, 120160229, 99991231, 101, 0]),
    ],
)
def test_invalid_values_are_the_rows_datetime_refuses(dtype: str, fmt: str, values: list) -> None:
    check(values + [None], dtype, fmt, ["hour"] if fmt.startswith("%H") else ["year"])


def test_missing_stays_missing_and_the_new_columns_are_categorical_int_keys() -> None:
    s = spec("t", "string")
    col = column_from_arrow(pa.array(["2014-10-21", None], pa.string()), s)
    op = DateParts(["t"], format="%Y-%m-%d", parts=["weekday"])
    op.bind({"t": s})
    out = op.transform(Batch({"t": col}, 2), cpu)
    assert list(out) == ["t_weekday"] and out["t_weekday"].valid.tolist() == [True, False]
    assert op.outputs == ["t_weekday"] and op.columns == ["t"]
    assert op.new_columns() == {"t_weekday": ColumnSpec("t_weekday", "categorical", "int64", "int")}


@pytest.mark.parametrize(
    "params,problem",
    [
        ({"format": "%Y-%m-%d %I", "parts": ["year"]}, "directive %I is not supported"),
        ({"format": "%Y %Y", "parts": ["year"]}, "the year appears twice"),
        ({"format": "%Y %y", "parts": ["year"]}, "the year appears twice"),
        ({"format": "date", "parts": ["year"]}, "has no date or time field"),
        ({"format": "", "parts": ["year"]}, "format must be"),
        ({"format": 2014, "parts": ["year"]}, "format must be"),
        ({"format": "%Y%m", "parts": ["day"]}, "does not determine the day"),
        ({"format": "%Y%m", "parts": ["weekday"]}, "does not determine the weekday"),
        ({"format": "%Y%m%d", "parts": ["minute"]}, "does not determine the minute"),
        ({"format": "unix", "parts": []}, "non-empty list"),
        ({"format": "unix", "parts": ["second"]}, "non-empty list"),
        ({"format": "unix", "parts": "hour"}, "non-empty list"),
        ({"format": "unix", "parts": ["hour", "hour"]}, "'hour' is listed more than once"),
    ],
)
def test_parameters_are_checked(params: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        DateParts(["t"], **params)


@pytest.mark.parametrize(
    "column,fmt,problem",
    [
        (ColumnSpec("t", "dense", "float64"), "unix", "is float64"),
        (ColumnSpec("t", "list", "string", "string", None, "|"), "unix", "is a list column"),
        (ColumnSpec("t", "categorical", "int64", "int"), "%Y-%m-%d", "has literal text"),
    ],
)
def test_columns_that_cannot_be_read_are_refused_at_bind(column: ColumnSpec, fmt: str, problem: str) -> None:
    op = DateParts(["t"], format=fmt, parts=["year"])
    with pytest.raises(ValueError, match=problem):
        op.bind({"t": column})
    DateParts(["t"], format="unix", parts=["year"]).bind({"t": ColumnSpec("t", "dense", "int64")})  # dense int64: fine


def test_every_part_column_shares_the_missing_mask() -> None:
    values = [None, 968035345, None]
    got = run(values, "int64", "unix")
    assert all(v[0] is None and v[2] is None and v[1] is not None for v in got.values())
