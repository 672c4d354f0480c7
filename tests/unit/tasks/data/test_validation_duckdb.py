"""The in-process validation (DuckDB) is Spark's validation: the same good events and the same
quarantine (rows, reasons and the input values as text), for every column type it takes; and it
declines the types whose parsing stays with Spark."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.data.spark_text import java_double_string
from tasks.data.validation import conform_events, split_valid_events
from tasks.data.validation_duckdb import (
    GOOD_EVENTS_SCHEMA,
    InProcessValidation,
    in_process_type_problem,
)
from tasks.data.validation_sql import RowBounds
from tasks.definitions.contract import CONTRACT_COLUMNS

pytestmark = pytest.mark.integration

T = dt.datetime(2025, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
US = dt.timedelta(microseconds=1)

# (customer_id, event_time, amount, event_type, quantity, category, channel)
EDGE_ROWS = [
    ("a", T, 10.0, "purchase", 2, "x", "web"),
    ("a", T, 10.0, "purchase", 2, "x", "web"),  # duplicate
    ("a", T, 10.0, "purchase", 2, "x", "web"),  # and another
    (" a ", T, 10.0, " purchase ", 2, "x", "web"),  # the same once trimmed
    ("b", T + 120 * US, -0.0, "", None, None, " "),  # defaults; -0.0 kept as 0.0
    ("b", T + 120 * US, 0.0, "purchase", 1, None, None),  # ... and so a duplicate of it
    ("c", T - dt.timedelta(days=400), 1e7, "view", 1, "y", None),
    ("c", T + 500_000 * US, 0.00099, "view", 3, "y", None),
    ("", T, 5.0, "purchase", 1, "x", "web"),  # missing customer
    ("  ", T, 5.0, "purchase", 1, "x", "web"),
    (None, T, 5.0, "purchase", 1, "x", "web"),
    ("d", None, 5.0, "purchase", 1, "x", "web"),  # invalid time
    ("d", T, None, "purchase", 1, "x", "web"),  # invalid amounts
    ("d", T, math.nan, "purchase", 1, "x", "web"),
    ("d", T, math.inf, "purchase", 1, "x", "web"),
    ("d", T, -1.5, "purchase", 1, "x", "web"),
    ("d", T, -1.5, "purchase", 1, "x", "web"),  # a bad row twice: quarantined twice
    ("e", T, 1.25e-5, "purchase", 0, "x", "web"),  # invalid quantities
    ("e", T, 123456789.125, "purchase", -3, "x", "web"),
    ("f", T, 2.5, "purchase", 1, "x", "web"),
    ("g", T, 3.0, "Transaction", 1, "x", "web"),  # public logs' names: purchase
    ("g", T + US, 3.0, " cart ", 1, "x", "web"),  # add_to_cart
    ("g", T + 2 * US, 3.0, "remove_from_cart", 1, "x", "web"),  # kept as it is
]
SCHEMA = GOOD_EVENTS_SCHEMA.set(4, pa.field("quantity", pa.int64()))  # as users write it


def _edge_table() -> pa.Table:
    return pa.Table.from_pylist(
        [dict(zip(SCHEMA.names, r, strict=True)) for r in EDGE_ROWS], SCHEMA
    )


def _variants() -> dict[str, pa.Table]:
    """The edge rows with the column types users' files bring."""
    edge = _edge_table()
    quantity = edge["quantity"]
    fractional = pc.if_else(pc.equal(quantity, 2), 2.5, pc.cast(quantity, pa.float64()))
    huge = pa.array([3_000_000_000] + [1] * (edge.num_rows - 1), pa.int64())
    ints = pa.array([i % 4 for i in range(edge.num_rows)], pa.int32())
    return {
        "typed": edge,
        "double_quantity_ms_naive_time": edge.set_column(
            4,
            "quantity",
            pc.if_else(pc.equal(pc.cast(quantity, pa.int64()), 0), math.nan, fractional),
        ).set_column(1, "event_time", pc.cast(edge["event_time"], pa.timestamp("ms"), safe=False)),
        "int_ids_amounts_and_mix": pa.table(
            {
                "customer_id": pa.array([i % 5 for i in range(edge.num_rows)], pa.int64()),
                "event_time": pa.array(
                    [dt.date(2025, 1, 1 + i % 3) if i != 7 else None for i in range(edge.num_rows)],
                    pa.date32(),
                ),
                "amount": pa.array([(i % 3) - 1 for i in range(edge.num_rows)], pa.int16()),
                "quantity": huge,
                "event_type": pa.array([i % 2 == 0 for i in range(edge.num_rows)], pa.bool_()),
                "category": ints,
                "channel": pa.DictionaryArray.from_arrays(
                    pa.array([i % 2 for i in range(edge.num_rows)], pa.int8()), ["web", " "]
                ),
            }
        ),
        "required_only": edge.select(["customer_id", "event_time", "amount"]),
    }


def _spark_results(spark, path, bounds=None) -> tuple[list[dict], list[dict]]:
    parts = split_valid_events(conform_events(spark.read.parquet(str(path))), 2, bounds)
    try:
        good = [r.asDict() for r in parts.good.collect()]
        quarantine = [r.asDict() for r in parts.quarantine.collect()]
    finally:
        parts.release()
    return good, quarantine


def _normalised(rows: list[dict]) -> list[tuple]:
    """Rows comparable across engines: times as UTC micros, NaN as text."""
    out = []
    for row in rows:
        values = []
        for name, value in row.items():
            if isinstance(value, dt.datetime):
                aware = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
                value = int((aware - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) / US)
            elif isinstance(value, float):
                value = java_double_string(value)
            values.append((name, value))
        out.append(tuple(values))
    return sorted(out, key=repr)


def _in_process(table: pa.Table, path, reader: str, bounds=None):
    """Good events, quarantine and figures, from the table in memory or from its file."""
    if reader == "table":
        checked = InProcessValidation.of_table(table, bounds)
    else:
        schema = pq.read_schema(path)
        sources = {c: c for c in schema.names}
        checked = InProcessValidation.of_parquet([path], schema, sources, bounds)
    try:
        return checked.good(), checked.quarantine(), checked.figures()
    finally:
        checked.close()


@pytest.mark.parametrize("reader", ["table", "parquet"])
@pytest.mark.parametrize("variant", list(_variants()))
def test_duckdb_and_spark_validate_alike(spark, tmp_path, variant, reader):
    table = _variants()[variant]
    assert in_process_type_problem(table.schema) is None
    path = tmp_path / "events.parquet"
    pq.write_table(table, path)
    spark_good, spark_quarantine = _spark_results(spark, path)
    good, quarantine, figures = _in_process(table, path, reader)
    assert good.column_names == list(CONTRACT_COLUMNS)
    assert _normalised(good.to_pylist()) == _normalised(spark_good)
    assert _normalised(quarantine.to_pylist()) == _normalised(spark_quarantine)
    assert figures.rows_valid == len(spark_good)
    assert figures.rows_quarantined == len(spark_quarantine)
    reasons: dict[str, int] = {}
    for row in spark_quarantine:
        reasons[row["reason"]] = reasons.get(row["reason"], 0) + 1
    assert figures.quarantined == reasons
    assert len(reasons) >= 2  # the edge rows reach several rules in every variant


BOUNDS = RowBounds.around(T, dt.timedelta(hours=24), dt.date(2000, 1, 1))
BOUNDED_ROWS = [
    ("a", T, 10.0),
    ("a", T + dt.timedelta(hours=24), 10.0),  # at the ceiling: kept
    ("b", T + dt.timedelta(hours=24) + US, 10.0),  # in the future
    ("b", dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC), 10.0),
    ("b", dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC), 10.0),  # twice: twice
    ("c", dt.datetime(2000, 1, 1, tzinfo=dt.UTC), 1.0),  # at the floor: kept
    ("c", dt.datetime(2000, 1, 1, tzinfo=dt.UTC) - US, 1.0),  # before it
    ("c", dt.datetime(1, 1, 1, tzinfo=dt.UTC), 1.0),
    ("", dt.datetime(1, 1, 1, tzinfo=dt.UTC), 1.0),  # a missing id is the first reason
    ("d", dt.datetime(9999, 1, 1, tzinfo=dt.UTC), -1.0),  # the time before the amount
]


@pytest.mark.parametrize("reader", ["table", "parquet"])
def test_duckdb_and_spark_bound_event_times_alike(spark, tmp_path, reader):
    table = pa.table(
        {
            "customer_id": [r[0] for r in BOUNDED_ROWS],
            "event_time": pa.array([r[1] for r in BOUNDED_ROWS], pa.timestamp("us", tz="UTC")),
            "amount": [r[2] for r in BOUNDED_ROWS],
        }
    )
    path = tmp_path / "events.parquet"
    pq.write_table(table, path)
    spark_good, spark_quarantine = _spark_results(spark, path, BOUNDS)
    good, quarantine, figures = _in_process(table, path, reader, BOUNDS)
    assert _normalised(good.to_pylist()) == _normalised(spark_good)
    assert _normalised(quarantine.to_pylist()) == _normalised(spark_quarantine)
    assert figures.quarantined == {
        "event_time_in_future": 4,
        "event_time_before_floor": 2,
        "missing_customer_id": 1,
    }
    assert figures.rows_valid == 3
    future = [r for r in spark_quarantine if r["reason"] == "event_time_in_future"]
    assert sorted(r["event_time"] for r in future)[-1] == "9999-12-31 23:59:59"


FLOAT_IDS = [13085.0, 13085.0, 12345678.0, 13085.5, math.nan, None, -0.0, 1e17, 2.0**53, 7.0]


def _validated_alike(spark, tmp_path, table: pa.Table, reader: str):
    """``table`` validated by Spark and in process (``reader``): both engines' good and
    quarantined rows equal; Spark's good rows and the in-process figures."""
    assert in_process_type_problem(table.schema) is None
    path = tmp_path / "events.parquet"
    pq.write_table(table, path)
    spark_good, spark_quarantine = _spark_results(spark, path)
    good, quarantine, figures = _in_process(table, path, reader)
    assert _normalised(good.to_pylist()) == _normalised(spark_good)
    assert _normalised(quarantine.to_pylist()) == _normalised(spark_quarantine)
    return spark_good, figures


@pytest.mark.parametrize("reader", ["table", "parquet"])
def test_float_customer_ids_are_read_as_integers_on_both_engines(spark, tmp_path, reader):
    # pandas writes an integer id column with a missing value as float64 (UCI Online Retail
    # II's "Customer ID"): whole numbers are the integer's text, as a client sends the id
    table = pa.table(
        {
            "customer_id": pa.array(FLOAT_IDS, pa.float64()),
            "event_time": pa.array([T] * len(FLOAT_IDS), pa.timestamp("us", tz="UTC")),
            "amount": [1.0] * 9 + [2.0],
        }
    )
    spark_good, figures = _validated_alike(spark, tmp_path, table, reader)
    assert sorted(r["customer_id"] for r in spark_good) == sorted(
        ["13085", "12345678", "13085.5", "0", "1.0E17", "9.007199254740992E15", "7"]
    )
    assert figures.quarantined == {"missing_customer_id": 2, "duplicate_event": 1}


@pytest.mark.parametrize("reader", ["table", "parquet"])
def test_database_types_validate_alike(spark, tmp_path, reader):
    # a database's export: decimal(18,2) money, int64 ids, dictionary-encoded text, UTC times
    rows = [  # (id, micros after T, amount, event type)
        (1, 0, "12.50", "purchase"),
        (1, 1, "0.00", "view"),
        (2, 2, "-1.50", "purchase"),  # invalid amounts
        (2, 3, None, "purchase"),
        (3, 4, "9999999999999999.99", "purchase"),
        (3, 5, "0.10", "view"),
        (3, 5, "0.10", "view"),  # a copy
        (10**12, 6, "3.33", "purchase"),
    ]
    table = pa.table(
        {
            "customer_id": pa.array([r[0] for r in rows], pa.int64()),
            "event_time": pa.array([T + r[1] * US for r in rows], pa.timestamp("us", tz="UTC")),
            "amount": pa.array(
                [None if r[2] is None else Decimal(r[2]) for r in rows], pa.decimal128(18, 2)
            ),
            "event_type": pa.array([r[3] for r in rows]).dictionary_encode(),
        }
    )
    spark_good, figures = _validated_alike(spark, tmp_path, table, reader)
    assert figures.quarantined == {"invalid_amount": 2, "duplicate_event": 1}
    assert sorted(r["amount"] for r in spark_good) == [0.0, 0.1, 3.33, 12.5, 9999999999999999.99]


def test_nanosecond_times_are_read_in_process_as_microseconds(tmp_path):
    # pandas writes datetime64[ns] to Parquet as nanoseconds (Spark refuses such a file)
    times = [T + dt.timedelta(microseconds=1), T - dt.timedelta(days=21000)]  # 1967: floored
    micros = pa.table(
        {"customer_id": ["a", "b"], "event_time": pa.array(times, pa.timestamp("us")),
         "amount": [1.0, 2.0]}
    )  # fmt: skip
    as_ns = pc.add(pc.multiply(micros["event_time"].cast(pa.int64()), 1000), 999)
    nanos = micros.set_column(1, "event_time", as_ns.cast(pa.timestamp("ns")))
    results = []
    for table in (micros, nanos):
        path = tmp_path / f"{table.schema.field('event_time').type.unit}.parquet"
        pq.write_table(table, path)
        assert in_process_type_problem(pq.read_schema(path)) is None
        good, quarantine, _ = _in_process(table, path, "parquet")
        results.append((_normalised(good.to_pylist()), _normalised(quarantine.to_pylist())))
    assert results[0] == results[1]


def test_demo_events_validate_alike(spark, tmp_path):
    out = tmp_path / "demo"
    generate_demo_events(DemoDataParams(customers=300, days=400, seed=5), out)
    path = next(out.glob("*.parquet"))
    spark_good, spark_quarantine = _spark_results(spark, path)
    good, quarantine, figures = _in_process(pq.read_table(path), path, "parquet")
    assert _normalised(good.to_pylist()) == _normalised(spark_good)
    assert _normalised(quarantine.to_pylist()) == _normalised(spark_quarantine)
    assert spark_quarantine  # the demo plants bad rows and duplicates
    times = pc.min_max(good["event_time"])
    assert figures.first_micros == times["min"].cast(pa.int64()).as_py()
    assert figures.last_micros == times["max"].cast(pa.int64()).as_py()


@pytest.mark.parametrize(
    ("column", "dtype"),
    [
        ("event_time", pa.date64()),
        ("amount", pa.float32()),
        ("amount", pa.decimal128(38, 10)),  # long decimals: Spark's text of them
        ("customer_id", pa.uint64()),
    ],
)
def test_types_spark_parses_are_declined(column, dtype):
    schema = SCHEMA.set(SCHEMA.get_field_index(column), pa.field(column, dtype))
    problem = in_process_type_problem(schema)
    assert problem is not None and column in problem


def test_text_is_parsed_in_process_unless_its_time_pattern_is_spark_s_alone():
    text = pa.schema(
        [(c, pa.string()) for c in ("customer_id", "event_time", "amount", "quantity")]
    )
    for fmt in (None, "epoch_seconds", "epoch_millis", "dd/MM/yyyy HH:mm", "d.M.yyyy"):
        assert in_process_type_problem(text, fmt) is None
    problem = in_process_type_problem(text, "MM/dd/yyyy hh:mm a")
    assert problem is not None and "event_time" in problem and "Spark" in problem


def test_spark_text_of_doubles():
    cases = [
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (1.0, "1.0"),
        (0.1, "0.1"),
        (1e7, "1.0E7"),
        (9999999.0, "9999999.0"),
        (1e-3, "0.001"),
        (0.00099, "9.9E-4"),
        (1.5e-5, "1.5E-5"),
        (-1e21, "-1.0E21"),
        (123456789.123, "1.23456789123E8"),
        (math.nan, "NaN"),
        (math.inf, "Infinity"),
        (-math.inf, "-Infinity"),
    ]
    assert [(v, java_double_string(v)) for v, _ in cases] == cases
