"""Date formats compiled into fixed-width fields."""

from __future__ import annotations

import pytest

from etl.backends.dates import FIELDS, compile_format


def test_a_format_is_a_template_of_literal_bytes_and_digit_fields() -> None:
    f = compile_format("%d/%m/%Y %H:%M")
    assert not f.unix and f.length == len("21/10/2014 00:00") and not f.digits_only
    assert bytes(b for b in f.template if b >= 0) == b"// :"
    assert dict(zip(FIELDS, zip(f.starts, f.widths))) == {"year": (6, 4), "month": (3, 2), "day": (0, 2), "hour": (11, 2),
                                                          "minute": (14, 2), "second": (0, 0)}  # fmt: skip
    assert [p for p in ("year", "month", "day", "hour", "minute", "weekday") if f.has(p)] == ["year", "month", "day", "hour", "minute", "weekday"]


def test_percent_and_non_ascii_literals_take_their_bytes() -> None:
    f = compile_format("%%%y年%m")
    assert f.template == (ord("%"), -1, -1, *"年".encode(), -1, -1) and f.short_year
    assert f.has("month") and not f.has("day") and not f.has("weekday")


def test_digit_only_formats_and_unix() -> None:
    f = compile_format("%y%m%d%H")
    assert f.digits_only and f.length == 8 and f.short_year and not f.has("minute")
    u = compile_format("unix")
    assert u.unix and all(u.has(p) for p in ("year", "month", "day", "hour", "minute", "weekday"))


@pytest.mark.parametrize("text", ["%j", "%Y-%m-%d %z", "%", "%Y%Y", "%m%y%Y", "literal", "", None, 5])
def test_other_formats_are_refused(text: object) -> None:
    with pytest.raises(ValueError, match="format"):
        compile_format(text)
