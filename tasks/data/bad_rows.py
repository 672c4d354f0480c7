"""The bad-rows policy of validation: a run stops (an input error naming the quarantine, each
reason's count and what to do about it) when more than ``max_bad_fraction`` of its rows were
quarantined, or none is left."""

from __future__ import annotations

from typing import Protocol

from infra.errors import HybridflowInputError
from tasks.definitions.contract import (
    REASON_AMOUNT_TOO_LARGE,
    REASON_DUPLICATE,
    REASON_EVENT_TIME_BEFORE_FLOOR,
    REASON_EVENT_TIME_IN_FUTURE,
    REASON_INVALID_AMOUNT,
    REASON_INVALID_EVENT_TIME,
    REASON_INVALID_QUANTITY,
    REASON_MISSING_CUSTOMER_ID,
)

REASON_ADVICE: dict[str, str] = {
    REASON_MISSING_CUSTOMER_ID: "no customer id: check --map customer_id=...; rows that belong "
    "to no customer (guest orders) are expected in some logs: raise --max-bad-fraction",
    REASON_INVALID_EVENT_TIME: "event_time not parsed: give its format with --timestamp-format "
    "(a Spark pattern like 'M/d/yyyy H:mm', epoch_seconds or epoch_millis)",
    REASON_EVENT_TIME_IN_FUTURE: "event_time later than now plus HYBRIDFLOW_EVENT_TIME_MAX_LEAD_HOURS: "
    "check the time zone, or day and month swapped (--timestamp-format)",
    REASON_EVENT_TIME_BEFORE_FLOOR: "event_time before HYBRIDFLOW_EVENT_TIME_FLOOR: check the "
    "format (two-digit years?) with --timestamp-format, or lower the floor",
    REASON_INVALID_AMOUNT: "amount missing, negative or not a number (returns and refunds are "
    "not purchases): check --map amount=...",
    REASON_AMOUNT_TOO_LARGE: "amount over HYBRIDFLOW_MAX_AMOUNT: check the unit (cents?)",
    REASON_INVALID_QUANTITY: "quantity not a whole number of at least 1 (cancellations and "
    "returns carry negative quantities)",
    REASON_DUPLICATE: "exact repeats of another row in every contract column",
}
"""What each quarantine reason usually means in a real log, and the option that fixes it."""


class ValidationCounts(Protocol):
    """What the policy reads of a validate result."""

    @property
    def rows_read(self) -> int: ...

    @property
    def rows_valid(self) -> int: ...

    @property
    def rows_quarantined(self) -> int: ...

    @property
    def quarantine_uri(self) -> str: ...

    @property
    def quarantine_reasons(self) -> dict[str, int]: ...


def check_bad_fraction(result: ValidationCounts, max_bad_fraction: float) -> None:
    """Fail (input error naming the quarantine and the reasons) when too many rows are bad or
    none is good."""
    bad_fraction = result.rows_quarantined / max(result.rows_read, 1)
    if bad_fraction > max_bad_fraction:
        raise HybridflowInputError(
            f"{result.rows_quarantined:,} of {result.rows_read:,} event rows ({bad_fraction:.1%}) "
            f"are bad, over --max-bad-fraction {max_bad_fraction:.1%}: "
            f"{reasons_in_words(result.quarantine_reasons, result.rows_read)}; "
            f"see {result.quarantine_uri}"
        )
    if result.rows_valid == 0:
        raise HybridflowInputError(
            "no valid events left after validation: "
            f"{reasons_in_words(result.quarantine_reasons, result.rows_read)}; "
            f"see {result.quarantine_uri}"
        )


def reasons_in_words(reasons: dict[str, int], rows_read: int) -> str:
    """Each reason's rows, the most first, with its share of the rows read and its advice."""
    parts = []
    for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        if count <= 0:
            continue
        advice = REASON_ADVICE.get(reason)
        share = f"{count / max(rows_read, 1):.1%}"
        parts.append(f"{reason} {count:,} ({share}{': ' + advice if advice else ''})")
    return "; ".join(parts) if parts else "no reason recorded"
