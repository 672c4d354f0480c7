"""Values written as Spark's ``CAST(... AS STRING)`` writes them, for outputs computed outside
Spark that must read the same (the quarantine's raw values).

Doubles follow Java's ``Double.toString`` layout: plain digits from 1e-3 up to 1e7, else
``d.dddE<exp>``; ``NaN``, ``Infinity``. The digits are the shortest that read back as the same
double, as Java 19+ prints them; Java 17's printer adds a digit to a few 16-17 digit values
(``1e23`` prints as ``9.999999999999999E22`` there), which this does not copy.
"""

from __future__ import annotations

import math
from decimal import Decimal

PLAIN_FROM, PLAIN_BELOW = 1e-3, 1e7


def java_double_string(value: float) -> str:
    """``value`` as Spark casts a double to a string."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    shortest = Decimal(repr(value))
    if PLAIN_FROM <= abs(value) < PLAIN_BELOW:
        text = format(shortest, "f")
        return text if "." in text else f"{text}.0"
    sign, digits, exponent = shortest.as_tuple()
    significant = "".join(map(str, digits)).rstrip("0") or "0"
    power = len(digits) + int(exponent) - 1
    fraction = significant[1:] or "0"
    return f"{'-' if sign else ''}{significant[0]}.{fraction}E{power}"
