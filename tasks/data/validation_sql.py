"""The events contract's rules as one SQL text that both engines run: Spark SQL
(:mod:`tasks.data.validation`) and DuckDB in process (:mod:`tasks.data.validation_duckdb`).

Only the prepared input differs by engine (each parses its input types its own way): a relation
of *conformed events* with the contract's typed columns (``customer_id`` trimmed text,
``event_time`` as integer microseconds since the epoch in UTC, ``amount`` a double,
``quantity`` an int or null when not a whole number, the optional text columns with their
defaults) and, for every contract column the input has, ``src_<column>``: its input value. Each
engine also defines the few functions below under the same names, so that the text is the same:

- ``input_text_<column>(src)``: an input value as Spark's ``CAST(... AS STRING)`` writes it (the
  quarantine keeps what the user sent);
- ``timestamp_text(micros)``, ``double_text(x)``: a kept value as Spark writes it as text;
- ``utc_timestamp(micros)``: the engine's UTC timestamp;
- ``explode``/``sequence`` are Spark's; DuckDB gets them as macros.

To add a rule: a reason in :data:`tasks.definitions.contract.QUARANTINE_REASONS` and a :class:`Rule`
in :data:`RULES` (a condition over the conformed columns that is true for a row that breaks it;
the first rule a row breaks is its reason; a rule with a parameter, such as a time floor, writes
it into the condition as a literal, and :func:`deduplicated_sql` takes the rules to apply). Both
engines then quarantine by it;
``tests/unit/tasks/data/test_validation_duckdb.py`` holds their outputs equal.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from tasks.definitions.contract import (
    CONTRACT_COLUMNS,
    REASON_AMOUNT_TOO_LARGE,
    REASON_DUPLICATE,
    REASON_EVENT_TIME_BEFORE_FLOOR,
    REASON_EVENT_TIME_IN_FUTURE,
    REASON_INVALID_AMOUNT,
    REASON_INVALID_EVENT_TIME,
    REASON_INVALID_QUANTITY,
    REASON_MISSING_CUSTOMER_ID,
)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

TYPED_IN_TEXT = {"event_time": "timestamp_text", "amount": "double_text"}
ROW_KEY = "row_key"
"""The conformed events' hash of the input's columns outside the contract (null without any):
rows that differ only there are not copies of one event."""
"""The functions that write a kept (typed) value as text; other columns are cast."""


@dataclass(frozen=True)
class Rule:
    """A contract rule: ``condition`` (SQL over the conformed columns) is true for a row that
    breaks it; a rule that ``needs`` an input column applies only when the input has it."""

    reason: str
    condition: str
    needs: str | None = None


RULES: tuple[Rule, ...] = (
    Rule(REASON_MISSING_CUSTOMER_ID, "customer_id IS NULL OR customer_id = ''"),
    Rule(REASON_INVALID_EVENT_TIME, "event_time IS NULL"),
    Rule(
        REASON_INVALID_AMOUNT,
        "amount IS NULL OR isnan(amount) OR abs(amount) = CAST('Infinity' AS DOUBLE) OR amount < 0",
    ),
    Rule(
        REASON_INVALID_QUANTITY,
        "src_quantity IS NOT NULL AND (quantity IS NULL OR quantity < 1)",
        needs="quantity",
    ),
)


@dataclass(frozen=True)
class RowBounds:
    """The values a run accepts: event times from ``floor`` up to ``ceiling`` (both included,
    aware UTC), amounts up to ``max_amount`` (None: any finite one). Rows outside are
    quarantined (``event_time_before_floor``, ``event_time_in_future``, ``amount_too_large``)."""

    floor: dt.datetime
    ceiling: dt.datetime
    max_amount: float | None = None

    @classmethod
    def around(
        cls,
        now: dt.datetime,
        max_lead: dt.timedelta,
        floor: dt.date,
        max_amount: float | None = None,
    ) -> RowBounds:
        """Events up to ``max_lead`` after ``now``, from the start of the day ``floor`` on."""
        start = dt.datetime.combine(floor, dt.time.min, tzinfo=dt.UTC)
        return cls(floor=start, ceiling=now.astimezone(dt.UTC) + max_lead, max_amount=max_amount)

    def floor_micros(self) -> int:
        return _micros(self.floor)

    def ceiling_micros(self) -> int:
        return _micros(self.ceiling)


def _micros(value: dt.datetime) -> int:
    return (value.astimezone(dt.UTC) - _EPOCH) // dt.timedelta(microseconds=1)


def contract_rules(bounds: RowBounds | None = None) -> tuple[Rule, ...]:
    """:data:`RULES` with, when ``bounds`` are given, the event-time bounds as literals right
    after the rule about unparsable times (so a row out of bounds is quarantined by its time),
    and the largest amount right after the rule about invalid amounts."""
    if bounds is None:
        return RULES
    rules = list(RULES)
    times = (
        Rule(REASON_EVENT_TIME_IN_FUTURE, f"event_time > {bounds.ceiling_micros()}"),
        Rule(REASON_EVENT_TIME_BEFORE_FLOOR, f"event_time < {bounds.floor_micros()}"),
    )
    at = next(i for i, r in enumerate(rules) if r.reason == REASON_INVALID_EVENT_TIME) + 1
    rules[at:at] = times
    if bounds.max_amount is not None:
        # repr: the shortest text that reads back as the same double, in both engines' SQL
        limit = f"CAST('{float(bounds.max_amount)!r}' AS DOUBLE)"
        at = next(i for i, r in enumerate(rules) if r.reason == REASON_INVALID_AMOUNT) + 1
        rules.insert(at, Rule(REASON_AMOUNT_TOO_LARGE, f"amount > {limit}"))
    return tuple(rules)


def reason_sql(present: Sequence[str], rules: Sequence[Rule] = RULES) -> str:
    """The first rule a conformed row breaks (its reason), or null for a good row."""
    cases = [
        f"WHEN {r.condition} THEN '{r.reason}'"
        for r in rules
        if r.needs is None or r.needs in present
    ]
    return f"CASE {' '.join(cases)} END"


def deduplicated_sql(
    source: str, present: Sequence[str], partitions: int, rules: Sequence[Rule] = RULES
) -> str:
    """Every distinct row of the conformed events ``source`` once, with ``copies`` (how many
    times it was read) and its ``reason``; a bad row also keeps its input values as text
    (``raw_<column>``, for the ``present`` columns), a good row only its typed values. Rows are
    the same when every column of the input is: ``source``'s ``row_key`` (a hash of the
    columns outside the contract, null without any) takes part, so two lines of one invoice
    that differ only in an item code are two events.

    The rows go to ``partitions`` partitions by ``customer_id`` first (a hint to Spark, whose
    group-by then needs no second shuffle and whose good rows come out clustered by customer; a
    comment to DuckDB). ``amount + 0.0`` makes -0.0 group (and be kept) as 0.0. In one
    group-by: Spark's form (its source is a shuffle, read once); DuckDB, which reads a view
    over the input twice more cheaply than it groups every row by the ``raw_`` texts and the
    reason, runs :func:`good_rows_sql` and :func:`bad_rows_sql` instead.
    """
    keys = ", ".join([*CONTRACT_COLUMNS, *(f"raw_{c}" for c in present), "reason", ROW_KEY])
    return f"""SELECT {keys}, count(*) AS copies FROM (
  SELECT /*+ REPARTITION({int(partitions)}, customer_id) */ {_typed()}{_raw(present)}, reason,
    {ROW_KEY}
  FROM {_flagged(source, present, rules)}
) AS flagged_rows
GROUP BY {keys}"""


def good_rows_sql(source: str, present: Sequence[str], rules: Sequence[Rule] = RULES) -> str:
    """The good rows of :func:`deduplicated_sql`, grouped only by what tells them apart (the
    contract's columns and ``row_key``): the contract's columns, ``row_key`` and ``copies``."""
    kept = ", ".join([*CONTRACT_COLUMNS, ROW_KEY])
    return f"""SELECT {kept}, count(*) AS copies
FROM (SELECT {_typed()}, {ROW_KEY} FROM {_flagged(source, present, rules)}
      WHERE reason IS NULL) AS good_rows
GROUP BY {kept}"""


def bad_rows_sql(source: str, present: Sequence[str], rules: Sequence[Rule] = RULES) -> str:
    """The bad rows of :func:`deduplicated_sql`, each read row on its own (``copies`` 1: a bad
    row is quarantined as many times as it is read, so grouping them changes nothing), with
    their input values ``src_<column>`` as read (:func:`deduplicated_from_sql` writes them as
    text, once the few bad rows are together)."""
    kept = ", ".join([*CONTRACT_COLUMNS, *(f"src_{c}" for c in present), "reason", ROW_KEY])
    return f"""SELECT {kept}, CAST(1 AS BIGINT) AS copies
FROM (SELECT {_typed()}{"".join(f", src_{c}" for c in present)}, reason, {ROW_KEY}
      FROM {_flagged(source, present, rules)} WHERE reason IS NOT NULL) AS bad_rows"""


def deduplicated_from_sql(good: str, bad: str, present: Sequence[str]) -> str:
    """:func:`deduplicated_sql`'s rows from the tables ``good`` (:func:`good_rows_sql`) and
    ``bad`` (:func:`bad_rows_sql`): the quarantine and figures read from them are the same."""
    no_text = "".join(f", CAST(NULL AS STRING) AS raw_{c}" for c in present)
    text = "".join(f", input_text_{c}(src_{c}) AS raw_{c}" for c in present)
    return f"""SELECT {", ".join(CONTRACT_COLUMNS)}{no_text}, CAST(NULL AS STRING) AS reason,
  {ROW_KEY}, copies FROM {good}
UNION ALL
SELECT {", ".join(CONTRACT_COLUMNS)}{text}, reason, {ROW_KEY}, copies FROM {bad}"""


def shared_rows_sql(
    source: str, present: Sequence[str], passes: int, rules: Sequence[Rule] = RULES
) -> str:
    """The conformed events ``source`` with their share of the customers (``_share``: a hash
    of the conformed id modulo ``passes``), to be written a share at a time and read back as
    conformed events: the same columns, but a good row's input values (``src_<column>``) null.
    Only a bad row's are quarantined, and a good row stays good without them (the one rule
    that reads one, on ``src_quantity``, holds only where it is not null), so the written
    shares hold about half the values."""
    src = "".join(f", CASE WHEN reason IS NOT NULL THEN src_{c} END AS src_{c}" for c in present)
    return f"""SELECT {", ".join(CONTRACT_COLUMNS)}{src}, {ROW_KEY},
  hash(customer_id) % {int(passes)} AS _share
FROM {_flagged(source, present, rules)}"""


def _flagged(source: str, present: Sequence[str], rules: Sequence[Rule]) -> str:
    """The conformed events ``source`` with their ``reason`` (null for a good row)."""
    return f"(SELECT *, {reason_sql(present, rules)} AS reason FROM {source}) AS flagged"


def _typed() -> str:
    """The contract's columns as rows are grouped and kept by."""
    return ", ".join(
        {
            "amount": "amount + CAST(0.0 AS DOUBLE) AS amount",
            "quantity": "coalesce(quantity, 1) AS quantity",
        }.get(c, c)
        for c in CONTRACT_COLUMNS
    )


def _raw(present: Sequence[str]) -> str:
    """A bad row's input values as text (``raw_<column>``), null for a good row."""
    return "".join(
        f", CASE WHEN reason IS NOT NULL THEN input_text_{c}(src_{c}) END AS raw_{c}"
        for c in present
    )


def good_sql(deduplicated: str) -> str:
    """The good events of :func:`deduplicated_sql`'s table ``deduplicated``, once each, in the
    contract's columns and types."""
    typed = {
        "event_time": "utc_timestamp(event_time) AS event_time",
        "quantity": "CAST(quantity AS INT) AS quantity",
    }
    columns = ", ".join(typed.get(c, c) for c in CONTRACT_COLUMNS)
    return f"SELECT {columns} FROM {deduplicated} WHERE reason IS NULL"


def quarantine_sql(deduplicated: str, present: Sequence[str]) -> str:
    """The quarantine from :func:`deduplicated_sql`'s table ``deduplicated``: a bad row as many
    times as it was read, with its input values; each extra copy of a good row as
    ``duplicate_event``, with the values that were kept. Every column is text."""
    columns = ", ".join(
        f"CASE WHEN reason IS NOT NULL THEN raw_{c} ELSE {_kept_text(c)} END AS {c}"
        for c in present
    )
    first_copy = "CASE WHEN reason IS NULL THEN CAST(2 AS BIGINT) ELSE CAST(1 AS BIGINT) END"
    return f"""SELECT {", ".join(present)}, reason FROM (
  SELECT {columns}, coalesce(reason, '{REASON_DUPLICATE}') AS reason,
         explode(sequence({first_copy}, copies)) AS copy
  FROM {deduplicated} WHERE reason IS NOT NULL OR copies > 1
) AS copies"""


def _kept_text(name: str) -> str:
    function = TYPED_IN_TEXT.get(name)
    return f"{function}({name})" if function else f"CAST({name} AS STRING)"
