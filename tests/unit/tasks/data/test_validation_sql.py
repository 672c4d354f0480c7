"""The validation rules' one SQL text: every rule has a declared reason, the first rule a row
breaks is its reason, and a rule about an optional column applies only when the input has it.
(Both engines running it alike: test_validation_duckdb.py.)"""

from __future__ import annotations

import datetime as dt

import duckdb
import pytest

from tasks.data.validation_sql import RULES, RowBounds, Rule, contract_rules, reason_sql
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
