"""The events input contract (DESIGN.md): column names, defaults, types and quarantine reasons."""

from __future__ import annotations

REQUIRED_COLUMNS: tuple[str, ...] = ("customer_id", "event_time", "amount")
OPTIONAL_DEFAULTS: dict[str, object] = {
    "event_type": "purchase",
    "quantity": 1,
    "category": None,
    "channel": None,
}
CONTRACT_COLUMNS: tuple[str, ...] = REQUIRED_COLUMNS + tuple(OPTIONAL_DEFAULTS)

_INTEGRAL = {"tinyint", "smallint", "int", "bigint"}
_NUMERIC = _INTEGRAL | {"float", "double", "decimal"}
# Spark type names (without parameters) each contract column can be cast from; "void" is an
# all-null column, whose rows the quarantine rules then catch.
ALLOWED_TYPES: dict[str, set[str]] = {
    "customer_id": _INTEGRAL | {"string", "decimal", "void"},
    "event_time": {"string", "timestamp", "timestamp_ntz", "date", "void"},
    "amount": _NUMERIC | {"string", "void"},
    "quantity": _NUMERIC | {"string", "void"},
    "event_type": _INTEGRAL | {"string", "boolean", "void"},
    "category": _INTEGRAL | {"string", "boolean", "void"},
    "channel": _INTEGRAL | {"string", "boolean", "void"},
}

REASON_MISSING_CUSTOMER_ID = "missing_customer_id"
REASON_INVALID_EVENT_TIME = "invalid_event_time"
REASON_EVENT_TIME_IN_FUTURE = "event_time_in_future"
REASON_EVENT_TIME_BEFORE_FLOOR = "event_time_before_floor"
REASON_INVALID_AMOUNT = "invalid_amount"
REASON_INVALID_QUANTITY = "invalid_quantity"
REASON_DUPLICATE = "duplicate_event"
QUARANTINE_REASONS: tuple[str, ...] = (
    REASON_MISSING_CUSTOMER_ID,
    REASON_INVALID_EVENT_TIME,
    REASON_EVENT_TIME_IN_FUTURE,
    REASON_EVENT_TIME_BEFORE_FLOOR,
    REASON_INVALID_AMOUNT,
    REASON_INVALID_QUANTITY,
    REASON_DUPLICATE,
)
