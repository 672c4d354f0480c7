"""The events input contract (DESIGN.md): column names, defaults and quarantine reasons."""

from __future__ import annotations

REQUIRED_COLUMNS: tuple[str, ...] = ("customer_id", "event_time", "amount")
OPTIONAL_DEFAULTS: dict[str, object] = {
    "event_type": "purchase",
    "quantity": 1,
    "category": None,
    "channel": None,
}
CONTRACT_COLUMNS: tuple[str, ...] = REQUIRED_COLUMNS + tuple(OPTIONAL_DEFAULTS)

REASON_MISSING_CUSTOMER_ID = "missing_customer_id"
REASON_INVALID_EVENT_TIME = "invalid_event_time"
REASON_INVALID_AMOUNT = "invalid_amount"
REASON_INVALID_QUANTITY = "invalid_quantity"
REASON_DUPLICATE = "duplicate_event"
QUARANTINE_REASONS: tuple[str, ...] = (
    REASON_MISSING_CUSTOMER_ID,
    REASON_INVALID_EVENT_TIME,
    REASON_INVALID_AMOUNT,
    REASON_INVALID_QUANTITY,
    REASON_DUPLICATE,
)
