"""The validation rules' one SQL text: every rule has a declared reason, the first rule a row
breaks is its reason, and a rule about an optional column applies only when the input has it.
(Both engines running it alike: test_validation_duckdb.py.)"""

from __future__ import annotations

import datetime as dt

import duckdb
import pytest

from tasks.data.validation_sql import (
    RULES,
    RowBounds,
    Rule,
    bad_rows_sql,
    contract_rules,
    deduplicated_from_sql,
    deduplicated_sql,
    good_rows_sql,
    good_sql,
    quarantine_sql,
    reason_sql,
)
from tasks.definitions.contract import QUARANTINE_REASONS, REASON_DUPLICATE

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
BOUNDS = RowBounds.around(NOW, dt.timedelta(hours=24), dt.date(1970, 1, 1), 1e12)

# conformed rows: customer_id, event_time (micros), amount, quantity, src_quantity
ROWS = [
    ("a", 1, 1.0, 1, "1", None),
    ("", None, -1.0, 0, "0", "missing_customer_id"),  # several rules: the first wins
    ("b", None, 1.0, 1, "1", "invalid_event_time"),
    ("b", 1, float("nan"), 1, "1", "invalid_amount"),
    ("b", 1, float("inf"), 1, "1", "invalid_amount"),
    ("b", 1, 2.0, None, "2.5", "invalid_quantity"),
    ("b", 1, 2.0, None, None, None),  # no quantity given: the default applies
]


def _reasons(present: list[str], rules=RULES) -> list[str | None]:
    con = duckdb.connect()
    try:
        con.execute(
            "CREATE TABLE conformed (customer_id VARCHAR, event_time BIGINT, amount DOUBLE,"
            " quantity INT, src_quantity VARCHAR)"
        )
        con.executemany("INSERT INTO conformed VALUES (?, ?, ?, ?, ?)", [r[:5] for r in ROWS])
        sql = f"SELECT {reason_sql(present, rules)} FROM conformed ORDER BY rowid"
        return [r[0] for r in con.execute(sql).fetchall()]
    finally:
        con.close()


def test_every_rule_has_its_own_declared_reason():
    reasons = [r.reason for r in contract_rules(BOUNDS)]
    assert len(set(reasons)) == len(reasons)
    assert set(reasons) | {REASON_DUPLICATE} == set(QUARANTINE_REASONS)


def test_the_first_rule_a_row_breaks_is_its_reason():
    assert _reasons(["customer_id", "event_time", "amount", "quantity"]) == [r[5] for r in ROWS]


def test_a_rule_about_an_absent_column_does_not_apply():
    reasons = _reasons(["customer_id", "event_time", "amount"])
    assert "invalid_quantity" not in reasons
    assert reasons[:5] == [r[5] for r in ROWS[:5]]


@pytest.mark.parametrize("extra_first", [True, False])
def test_a_new_rule_takes_its_place_in_the_order(extra_first):
    floor = Rule("before_time_floor", "event_time < 2")
    rules = (floor, *RULES) if extra_first else (*RULES, floor)
    reasons = _reasons(["customer_id", "event_time", "amount", "quantity"], rules)
    if extra_first:
        assert reasons[0] == "before_time_floor" and reasons[1] == "missing_customer_id"
    else:
        assert reasons[0] == "before_time_floor" and reasons[5] == "invalid_quantity"


def _micros(value: dt.datetime) -> int:
    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


def test_event_times_out_of_bounds_are_quarantined_by_their_own_reason():
    ceiling = NOW + dt.timedelta(hours=24)
    times = {
        "kept at the ceiling": _micros(ceiling),
        "one microsecond after": _micros(ceiling) + 1,
        "9999-12-31": _micros(dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)),
        "the floor": 0,
        "before the floor": -1,
        "year 1": _micros(dt.datetime(1, 1, 1, tzinfo=dt.UTC)),
    }
    con = duckdb.connect()
    try:
        con.execute(
            "CREATE TABLE conformed (customer_id VARCHAR, event_time BIGINT, amount DOUBLE)"
        )
        con.executemany(
            "INSERT INTO conformed VALUES (?, ?, ?)", [("a", t, 1.0) for t in times.values()]
        )
        con.execute("INSERT INTO conformed VALUES ('', -1, 1.0)")  # a missing id comes first
        sql = (
            f"SELECT {reason_sql(['customer_id', 'event_time', 'amount'], contract_rules(BOUNDS))}"
        )
        got = [r[0] for r in con.execute(f"{sql} FROM conformed ORDER BY rowid").fetchall()]
    finally:
        con.close()
    assert got == [
        None,
        "event_time_in_future",
        "event_time_in_future",
        None,
        "event_time_before_floor",
        "event_time_before_floor",
        "missing_customer_id",
    ]
    assert contract_rules(None) == RULES  # without bounds (the endpoint's own check): as before


def test_an_amount_over_the_largest_is_quarantined_after_the_invalid_ones():
    con = duckdb.connect()
    try:
        con.execute(
            "CREATE TABLE conformed (customer_id VARCHAR, event_time BIGINT, amount DOUBLE)"
        )
        rows = [("a", 1, 1e12), ("a", 1, 1.0000000000001e12), ("a", 1, 1e308), ("a", 1, -1e308)]
        con.executemany("INSERT INTO conformed VALUES (?, ?, ?)", rows)
        reasons = reason_sql(["customer_id", "event_time", "amount"], contract_rules(BOUNDS))
        got = [
            r[0] for r in con.execute(f"SELECT {reasons} FROM conformed ORDER BY rowid").fetchall()
        ]
    finally:
        con.close()
    assert got == [None, "amount_too_large", "amount_too_large", "invalid_amount"]


# conformed rows with their input values: customer_id, event_time, amount, quantity, the
# src_ values of those four, row_key
CONFORMED = [
    ("a", 1, 1.0, 1, "a", "t1", "1.0", "1", None),
    ("a", 1, 1.0, 1, " a", "t1", "1.00", "1", None),  # a copy once conformed
    ("a", 1, 1.0, 1, "a", "t1", "1.0", "1", None),  # and another
    ("a", 1, 1.0, 1, "a", "t1", "1.0", "1", 7),  # differs outside the contract: an event
    ("b", 2, 2.0, 1, "b", "t2", "2.0", "1", None),
    ("", 2, 2.0, 1, "", "t2", "2.0", "1", None),  # bad, read twice: quarantined twice
    ("", 2, 2.0, 1, "", "t2", "2.0", "1", None),
    ("", 2, 2.0, 1, " ", "t2", "2.0", "1", None),  # bad, other input text
    ("c", None, 2.0, 1, "c", "x", "2.0", "1", None),
    ("c", 3, float("nan"), 1, "c", "t3", "NaN", "1", None),
    ("c", 3, 3.0, None, "c", "t3", "3.0", "2.5", None),
]


def _validated(split: bool) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """Good rows, quarantine and copies per reason of :data:`CONFORMED`, through
    :func:`deduplicated_sql` (one group-by) or the good and bad rows apart."""
    present = ["customer_id", "event_time", "amount", "quantity"]
    con = duckdb.connect()
    try:
        con.execute(
            "CREATE TABLE conformed (customer_id VARCHAR, event_time BIGINT, amount DOUBLE,"
            " quantity INT, src_customer_id VARCHAR, src_event_time VARCHAR,"
            " src_amount VARCHAR, src_quantity VARCHAR, row_key UBIGINT)"
        )
        con.executemany("INSERT INTO conformed VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", CONFORMED)
        con.execute(
            "CREATE TABLE optional AS SELECT * FROM conformed, "
            "(SELECT 'purchase' AS event_type, NULL::VARCHAR AS category, "
            "NULL::VARCHAR AS channel)"
        )
        for name in ("input_text_" + c for c in present):
            con.execute(f"CREATE MACRO {name}(x) AS x")
        con.execute("CREATE MACRO timestamp_text(t) AS CAST(t AS VARCHAR)")
        con.execute("CREATE MACRO double_text(x) AS CAST(x AS VARCHAR)")
        con.execute("CREATE MACRO utc_timestamp(t) AS make_timestamptz(t)")
        con.execute("CREATE MACRO explode(x) AS unnest(x)")
        con.execute("CREATE MACRO sequence(a, b) AS generate_series(a, b)")
        if split:
            con.execute(f"CREATE TABLE good AS {good_rows_sql('optional', present)}")
            con.execute(f"CREATE TABLE bad AS {bad_rows_sql('optional', present)}")
            con.execute(
                f"CREATE TABLE deduplicated AS {deduplicated_from_sql('good', 'bad', present)}"
            )
        else:
            con.execute(f"CREATE TABLE deduplicated AS {deduplicated_sql('optional', present, 1)}")
        good = con.execute(f"{good_sql('deduplicated')} ORDER BY ALL").fetchall()
        quarantine = con.execute(
            f"{quarantine_sql('deduplicated', present)} ORDER BY ALL NULLS FIRST"
        ).fetchall()
        copies = con.execute(
            "SELECT reason, sum(copies - CASE WHEN reason IS NULL THEN 1 ELSE 0 END)::BIGINT "
            "FROM deduplicated GROUP BY reason ORDER BY reason NULLS FIRST"
        ).fetchall()
        return good, quarantine, copies
    finally:
        con.close()


def test_good_and_bad_rows_apart_validate_as_one_group_by():
    good, quarantine, copies = _validated(split=True)
    assert (good, quarantine, copies) == _validated(split=False)
    assert len(good) == 3  # a, a with another row key, b
    assert [r[-1] for r in quarantine].count("missing_customer_id") == 3
    assert [r[-1] for r in quarantine].count("duplicate_event") == 2
    assert len(quarantine) == 8
