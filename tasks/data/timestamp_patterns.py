"""``--timestamp-format``: a Spark datetime pattern checked before any engine starts, and the
patterns DuckDB parses exactly as Spark does, translated for it.

Plain Python. Spark (4.x) parses with the letters of :data:`SPARK_PARSE_LETTERS`; week-based
letters, ``E F q Q`` and a few others are refused by Spark when parsing, and a pattern that
holds one fails inside a Spark job. :func:`check_timestamp_format` refuses it up front with
one line. :func:`duckdb_pattern` gives the in-process engine a ``strptime`` format plus a regular
expression of the digit counts Spark insists on (``dd`` takes exactly two digits, ``d`` one or
two), for the subset of letters whose parsing is the same in both; other patterns stay with
Spark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infra.errors import HybridflowInputError

EPOCH_SECONDS, EPOCH_MILLIS = "epoch_seconds", "epoch_millis"
SPARK_PARSE_LETTERS = frozenset("GyDMLdahKkHmsSVzOXxZ")
"""Pattern letters Spark parses with; any other unquoted letter is refused."""
RESERVED = frozenset("#{}")
# letter -> (strptime directive, regex of its digits) by how many times it repeats
_IN_PROCESS: dict[str, dict[int, tuple[str, str]]] = {
    "y": {1: ("%Y", r"\d{1,9}"), 4: ("%Y", r"\d{4,9}")},
    "M": {1: ("%m", r"\d{1,2}"), 2: ("%m", r"\d{2}")},
    "d": {1: ("%d", r"\d{1,2}"), 2: ("%d", r"\d{2}")},
    "H": {1: ("%H", r"\d{1,2}"), 2: ("%H", r"\d{2}")},
    "m": {1: ("%M", r"\d{1,2}"), 2: ("%M", r"\d{2}")},
    "s": {1: ("%S", r"\d{1,2}"), 2: ("%S", r"\d{2}")},
}

_FIXED_WIDTHS = {"yyyy": 4, "MM": 2, "dd": 2, "HH": 2, "mm": 2, "ss": 2}
"""Numbers side by side (``yyyyMMdd``) DuckDB parses as Spark does: each of exactly this many
digits (Spark reads ``19970101`` and no 7 or 9 digits)."""


@dataclass(frozen=True)
class DuckdbPattern:
    """How DuckDB parses text as Spark parses it with one pattern: the text must fully match
    ``regex`` and then ``strptime`` with ``format``."""

    format: str
    regex: str


def _tokens(pattern: str) -> list[tuple[str, str]]:
    """``pattern`` as (kind, text) tokens: ``letters`` (one letter repeated), ``literal``."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "'":
            end = pattern.find("'", i + 1)
            if end < 0:
                raise HybridflowInputError(
                    f"--timestamp-format {pattern!r}: a quote ' is never closed "
                    "(quote literal text like 'T', and write '' for a quote)"
                )
            tokens.append(("literal", pattern[i + 1 : end] if end > i + 1 else "'"))
            i = end + 1
        elif c.isascii() and c.isalpha():
            j = i
            while j < len(pattern) and pattern[j] == c:
                j += 1
            tokens.append(("letters", pattern[i:j]))
            i = j
        else:
            tokens.append(("literal", c))
            i += 1
    return tokens


def check_timestamp_format(pattern: str | None) -> None:
    """Refuse a ``--timestamp-format`` Spark would refuse when parsing (one line, naming the
    letter); None and the epoch names pass."""
    if pattern is None or pattern in (EPOCH_SECONDS, EPOCH_MILLIS):
        return
    hint = (
        "give a Spark datetime pattern like 'dd/MM/yyyy HH:mm' (letters y M d H h m s S a, "
        "zones X Z z, literal text in quotes), epoch_seconds or epoch_millis"
    )
    if "%" in pattern:
        raise HybridflowInputError(
            f"--timestamp-format {pattern!r} looks like a strptime format: {hint}"
        )
    if not pattern.strip():
        raise HybridflowInputError(f"--timestamp-format is empty: {hint}")
    for kind, text in _tokens(pattern):
        if kind == "letters" and text[0] not in SPARK_PARSE_LETTERS:
            raise HybridflowInputError(
                f"--timestamp-format {pattern!r}: {text[0]!r} is not a letter Spark parses "
                f"dates with; {hint}"
            )
        if kind == "literal" and text in RESERVED:
            raise HybridflowInputError(
                f"--timestamp-format {pattern!r}: {text!r} is reserved in Spark patterns; {hint}"
            )


def duckdb_pattern(pattern: str) -> DuckdbPattern | None:
    """The DuckDB form of a Spark pattern made only of numeric years, months, days, 24-hour
    times and literal separators (each parsed the same way by both engines); None for any
    other pattern, or one with two numbers side by side (Spark parses those)."""
    check_timestamp_format(pattern)
    formats, regexes = [], []
    tokens = _tokens(pattern)
    for i, (kind, text) in enumerate(tokens):
        if kind == "literal":
            formats.append(text.replace("%", "%%"))
            regexes.append(re.escape(text))
            continue
        directive = _IN_PROCESS.get(text[0], {}).get(len(text))
        if directive is None:
            return None
        adjacent = any(0 <= j < len(tokens) and tokens[j][0] == "letters" for j in (i - 1, i + 1))
        if adjacent:  # yyyyMMdd: Spark reads such a number only when each part has its width
            width = _FIXED_WIDTHS.get(text)
            if width is None:
                return None
            directive = (directive[0], rf"\d{{{width}}}")
        formats.append(directive[0])
        regexes.append(directive[1])
    return DuckdbPattern(format="".join(formats), regex="".join(regexes))
