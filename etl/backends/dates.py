"""Dates as the backends read them: a date format compiled into fixed-width fields, and the calendar parts.

A ``DateFormat`` is either Unix seconds (``"unix"``: an integer count of seconds since 1970-01-01 00:00:00 UTC,
negative before it) or a ``strptime``-style format made of these directives and literal characters:

=========  ===============================  ======
directive  field                            digits
=========  ===============================  ======
``%Y``     year                             4
``%y``     year 1969-2068 (69-99 → 19xx,    2
           00-68 → 20xx, as ``strptime``)
``%m``     month 1-12                       2
``%d``     day of the month                 2
``%H``     hour 0-23                        2
``%M``     minute 0-59                      2
``%S``     second 0-59                      2
``%%``     a literal ``%``
=========  ===============================  ======

Every field has exactly its number of digits (zero-padded), so a format describes text of one length; other
directives are refused. Text must match the format byte for byte (literal bytes equal, digits where the fields
are, nothing before or after). An integer value is read as its decimal digits zero-padded on the left to the
format's length (so ``14102100`` in ``%y%m%d%H`` is 2014-10-21 00h, and ``1010100`` is 2001-01-01 00h); this
needs a format of directives only, and a value ``0 <= v < 10**length``. Fields the format lacks take the values
of ``strptime``: 1900-01-01 00:00:00.

A value is a date when its fields are in range (month 1-12, day 1 to the month's last day in the proleptic
Gregorian calendar, hour 0-23, minute 0-59, second 0-59, year 1-9999); Unix seconds are dates from
0001-01-01 00:00:00 to 9999-12-31 23:59:59 (``MIN_SECONDS`` .. ``MAX_SECONDS``), the range of Python's
``datetime``.

Parts (``PARTS``) of a date: ``year``, ``month`` (1-12), ``day`` (1-31), ``hour`` (0-23), ``minute`` (0-59) and
``weekday`` (0 = Monday .. 6 = Sunday, as ``datetime.weekday()``). Backends compute the day number ``z`` (days
since 1970-01-01) with ``days_from_civil`` and split day numbers with ``civil_from_days``, H. Hinnant's exact
integer algorithms (https://howardhinnant.github.io/date_algorithms.html), with floor division throughout;
weekday = ``(z + 3) mod 7`` (1970-01-01 was a Thursday).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The calendar parts, in the order of the rows of a backend's ``date_parts`` result.
PARTS = ("year", "month", "day", "hour", "minute", "weekday")
#: The fields a format can hold, in the order of ``DateFormat.starts`` and ``widths``.
FIELDS = ("year", "month", "day", "hour", "minute", "second")
#: The value of each of ``FIELDS`` when a format lacks it (``strptime``'s).
DEFAULTS = (1900, 1, 1, 0, 0, 0)
#: Directive letter → (field, digits).
DIRECTIVES = {"Y": ("year", 4), "y": ("year", 2), "m": ("month", 2), "d": ("day", 2), "H": ("hour", 2), "M": ("minute", 2), "S": ("second", 2)}
UNIX = "unix"
MIN_SECONDS = -62_135_596_800  # 0001-01-01 00:00:00 UTC
MAX_SECONDS = 253_402_300_799  # 9999-12-31 23:59:59 UTC
SECONDS_PER_DAY = 86_400
#: The fields each part needs from a format (Unix seconds give every part).
NEEDS = {"year": ("year",), "month": ("month",), "day": ("day",), "hour": ("hour",), "minute": ("minute",),
         "weekday": ("year", "month", "day")}  # fmt: skip


@dataclass(frozen=True)
class DateFormat:
    """A compiled date format (build it with ``compile_format``).

    ``template``: per byte of the text, the literal byte expected there, or -1 where a digit of a field is;
    ``starts``/``widths``: per field of ``FIELDS``, the position of its first digit and its number of digits
    (0 when the format lacks the field). Unix seconds (``unix``) have no template."""

    text: str
    unix: bool
    template: tuple[int, ...] = ()
    starts: tuple[int, ...] = (0,) * len(FIELDS)
    widths: tuple[int, ...] = (0,) * len(FIELDS)

    @property
    def length(self) -> int:
        """Bytes of a text that matches (digits of an integer value)."""
        return len(self.template)

    @property
    def digits_only(self) -> bool:
        """Whether the format is directives only (integer values can be read with it)."""
        return all(b < 0 for b in self.template)

    @property
    def short_year(self) -> bool:
        """Whether the year has two digits (``%y``)."""
        return self.widths[0] == 2

    def has(self, part: str) -> bool:
        """Whether values in this format determine ``part`` (Unix seconds determine every part)."""
        return self.unix or all(self.widths[FIELDS.index(f)] for f in NEEDS[part])

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(template, starts, widths, defaults) as int64 numpy arrays, for kernels."""
        template, starts, widths, defaults = (np.array(x, np.int64) for x in (self.template, self.starts, self.widths, DEFAULTS))
        return template, starts, widths, defaults


def compile_format(text: object) -> DateFormat:
    """The ``DateFormat`` of ``text`` (``"unix"`` or a format of the directives in the module docstring);
    ``ValueError`` naming the problem for anything else (another directive, a field twice, no field)."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"format must be 'unix' or a non-empty strptime format, got {text!r}")
    if text == UNIX:
        return DateFormat(text, True)
    template: list[int] = []
    starts, widths = [0] * len(FIELDS), [0] * len(FIELDS)
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "%":
            template.extend(ch.encode())
            i += 1
            continue
        d = text[i + 1 : i + 2]
        i += 2
        if d == "%":
            template.append(ord("%"))
            continue
        if d not in DIRECTIVES:
            known = ", ".join(f"%{k}" for k in DIRECTIVES)
            raise ValueError(f"format {text!r}: directive %{d} is not supported (supported: {known}, %%, or 'unix')")
        field, digits = DIRECTIVES[d]
        f = FIELDS.index(field)
        if widths[f]:
            raise ValueError(f"format {text!r}: the {field} appears twice")
        starts[f], widths[f] = len(template), digits
        template.extend([-1] * digits)
    if not any(widths):
        raise ValueError(f"format {text!r} has no date or time field")
    return DateFormat(text, False, tuple(template), tuple(starts), tuple(widths))
