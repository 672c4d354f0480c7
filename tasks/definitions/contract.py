"""The events input contract (DESIGN.md): column names, defaults, types and quarantine reasons."""

from __future__ import annotations

import re

REQUIRED_COLUMNS: tuple[str, ...] = ("customer_id", "event_time", "amount")
OPTIONAL_DEFAULTS: dict[str, object] = {
    "event_type": "purchase",
    "quantity": 1,
    "category": None,
    "channel": None,
}
CONTRACT_COLUMNS: tuple[str, ...] = REQUIRED_COLUMNS + tuple(OPTIONAL_DEFAULTS)
# Whole numbers read as epoch times, by their digits: seconds (2001-2286 with 10 digits) and
# milliseconds (1973-2286 with 13): the validate stage's detection of epoch texts, and the
# numbers POST /events takes as event_time (pandas' to_json writes milliseconds).
EPOCH_SECONDS_DIGITS = range(9, 11)
EPOCH_MILLIS_DIGITS = range(12, 14)
# What exports commonly call the required columns (compared lower-case, letters and digits only),
# most likely first: a missing column's error suggests the ``--map`` that reads it from one.
COLUMN_SYNONYMS: dict[str, tuple[str, ...]] = {
    "customer_id": (
        "customerid",
        "customer",
        "custid",
        "clientid",
        "client",
        "userid",
        "user",
        "memberid",
        "accountid",
        "customerno",
        "customernumber",
        "buyerid",
        "shopperid",
    ),
    "event_time": (
        "eventtime",
        "invoicedate",
        "orderdate",
        "transactiondate",
        "purchasedate",
        "timestamp",
        "datetime",
        "date",
        "time",
        "ts",
        "createdat",
        "eventdate",
        "saledate",
    ),
    "amount": (
        "totalamount",
        "total",
        "linetotal",
        "revenue",
        "sales",
        "amountspent",
        "spend",
        "netamount",
        "value",
        "price",
        "unitprice",
    ),
}
UNIT_PRICE_NAMES = ("price", "unitprice")  # a per-item price, not the event's total

INTEGRAL_DECIMAL_ID = r"^([+-]?[0-9]+)[.]0+$"
"""A customer id written as a whole number with a zero fraction (``13085.0``: pandas writes an
integer id column that has a missing value as floats): every reader keeps only its integer
part (``13085``), so the id a client sends (``13085`` or ``"13085"``) is the id the batch
stages hold. One pattern for Python's ``re``, Java's (Spark) and RE2 (DuckDB, Arrow), with
group 1 the integer part, and no backslash (``[.]``: SQL strings read alike); applied after
trimming. :func:`customer_id_text` is its Python form."""

WHOLE_DOUBLES = 2**53
"""A float id below this in magnitude that is a whole number is read as that integer (a double
holds each of them exactly; Spark would write ``12345678.0`` as ``1.2345678E7``)."""


def event_type_name(text: str, purchase_event: str | None = None) -> str:
    """An event type (trimmed) as the contract names it: ``purchase`` for the log's own
    ``purchase_event`` (any case), else :data:`EVENT_TYPE_SYNONYMS`."""
    if purchase_event is not None and text.lower() == purchase_event.strip().lower():
        return "purchase"
    return EVENT_TYPE_SYNONYMS.get(text.lower(), text)


PURCHASE_EVENT_PATTERN = r"^[^'\\]*[^'\\\s][^'\\]*$"
"""What a ``--purchase-event`` value may be: some text, without a quote or backslash (it is
written into both engines' SQL as a literal, which they escape differently)."""


def event_type_sql(text: str, purchase_event: str | None = None) -> str:
    """SQL, in Spark's and DuckDB's dialect alike, for :func:`event_type_name` of the trimmed
    text ``text`` (``purchase_event`` matching :data:`PURCHASE_EVENT_PATTERN`)."""
    names = dict(EVENT_TYPE_SYNONYMS)
    if purchase_event is not None:
        names[purchase_event.strip().lower()] = "purchase"  # the user's word wins
    cases = " ".join(f"WHEN '{alias}' THEN '{name}'" for alias, name in names.items())
    return f"CASE lower({text}) {cases} ELSE {text} END"


def customer_id_text(text: str) -> str:
    """A customer id as every stage holds it: trimmed of spaces, a zero fraction dropped
    (:data:`INTEGRAL_DECIMAL_ID`)."""
    trimmed = text.strip(" ")
    match = re.fullmatch(INTEGRAL_DECIMAL_ID, trimmed)
    return match.group(1) if match else trimmed


EVENT_TYPE_SYNONYMS: dict[str, str] = {
    "purchase": "purchase",
    "transaction": "purchase",  # RetailRocket
    "order": "purchase",
    "sale": "purchase",
    "buy": "purchase",
    "view": "view",
    "pageview": "view",
    "page_view": "view",
    "product_view": "view",
    "view_item": "view",  # Google Analytics 4
    "add_to_cart": "add_to_cart",
    "addtocart": "add_to_cart",  # RetailRocket
    "cart": "add_to_cart",  # REES46
    "add-to-cart": "add_to_cart",
    "add to cart": "add_to_cart",
    "add_to_basket": "add_to_cart",
    "return": "return",
    "returned": "return",
    "refund": "return",
}
"""Event types public logs write, by their lower-case text, and the contract's name for each:
``purchase`` (what the label and the purchase features count), ``view``, ``add_to_cart`` and
``return`` (the event mix). Every reader (both engines' validation, ``POST /events``) gives a
trimmed event type in this table its contract name (``Transaction`` is ``purchase``) and keeps
any other as it is (``remove_from_cart``: an event, not a purchase)."""

_INTEGRAL = {"tinyint", "smallint", "int", "bigint"}
_NUMERIC = _INTEGRAL | {"float", "double", "decimal"}
# Spark type names (without parameters) each contract column can be cast from; "void" is an
# all-null column, whose rows the quarantine rules then catch.
ALLOWED_TYPES: dict[str, set[str]] = {
    "customer_id": _NUMERIC | {"string", "void"},
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
REASON_AMOUNT_TOO_LARGE = "amount_too_large"
REASON_INVALID_QUANTITY = "invalid_quantity"
REASON_DUPLICATE = "duplicate_event"
QUARANTINE_REASONS: tuple[str, ...] = (
    REASON_MISSING_CUSTOMER_ID,
    REASON_INVALID_EVENT_TIME,
    REASON_EVENT_TIME_IN_FUTURE,
    REASON_EVENT_TIME_BEFORE_FLOOR,
    REASON_INVALID_AMOUNT,
    REASON_AMOUNT_TOO_LARGE,
    REASON_INVALID_QUANTITY,
    REASON_DUPLICATE,
)


def letters_only(name: str) -> str:
    """``name`` lower-case, letters and digits only (how synonyms are compared)."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def column_map_hints(missing: list[str], columns: list[str]) -> dict[str, str]:
    """For each missing required column, the input column (of ``columns``) an export most likely
    wrote it as (:data:`COLUMN_SYNONYMS`), when one is there."""
    by_letters = {letters_only(c): c for c in reversed(columns)}
    hints: dict[str, str] = {}
    for column in missing:
        for synonym in COLUMN_SYNONYMS.get(column, ()):
            source = by_letters.get(synonym)
            if source is not None and source not in hints.values():
                hints[column] = source
                break
    return hints
