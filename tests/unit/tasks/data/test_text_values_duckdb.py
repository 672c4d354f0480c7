"""DuckDB's reading of text values equals Spark's: the same numbers, the same nulls, value by
value; and the patterns Spark refuses are refused up front (:mod:`tasks.data.timestamp_patterns`).
(Times are held equal file by file in ``test_validate_contract.py``.)"""

from __future__ import annotations

import duckdb
import pytest
from pyspark.sql import functions as F

from infra.errors import HybridflowInputError
from tasks.data.text_values_duckdb import define_text_macros
from tasks.data.timestamp_patterns import check_timestamp_format, duckdb_pattern

NUMBERS = [
    "1", "1.5", " 1 ", "\t2\t", "+1", "-1", ".5", "1.", "1e3", "1E-3", "+.5e+2", "1d", "1f",
    "1D", "NaN", "nan", "Infinity", "-Infinity", "inf", "-inf", "+inf", "infinity", "INF",
    "1,5", "", "abc", "1_000", "1e400", "-0", "00012", "1.5e", "e5", "1 000",
    "1.7976931348623157E308", "12345678901234567890", "١",
]  # fmt: skip
SPARK_REFUSES = ["%Y-%m-%d", "yyyy-qq", "YYYY-MM-dd", "uuuu-MM-dd", "ww", "e", "bogus{", "foo"]
SPARK_PARSES = ["dd/MM/yyyy HH:mm", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX", "MM/dd/yyyy hh:mm a", "y"]


def _duckdb(values: list[str], expression: str) -> list:
    con = duckdb.connect()
    define_text_macros(con.execute)
    con.execute(
        "CREATE TABLE t AS SELECT unnest($1::VARCHAR[]) AS x, generate_subscripts($1, 1) AS i",
        [values],
    )
    return [r[0] for r in con.execute(f"SELECT {expression} FROM t ORDER BY i").fetchall()]


def _spark(spark, values: list[str], column, name: str = "x") -> list:
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], ["i", name])
    return [r[0] for r in df.orderBy("i").select(column(df)).collect()]


def _same(values, spark_values, duckdb_values) -> None:
    diffs = [
        (v, s, d)
        for v, s, d in zip(values, spark_values, duckdb_values, strict=True)
        if str(s) != str(d)
    ]
    assert diffs == []


@pytest.mark.integration
def test_numbers_read_as_spark_reads_them(spark):
    spark_doubles = _spark(spark, NUMBERS, lambda df: F.col("x").try_cast("double"))
    _same(NUMBERS, spark_doubles, _duckdb(NUMBERS, "spark_double(x)"))


@pytest.mark.integration
def test_patterns_are_refused_up_front_exactly_when_spark_refuses_them(spark):
    df = spark.createDataFrame([("2025-01-02",)], ["t"])
    for pattern in SPARK_REFUSES:
        with pytest.raises(HybridflowInputError):
            check_timestamp_format(pattern)
        with pytest.raises(Exception):  # noqa: B017 - Spark's exception types vary by letter
            df.select(F.try_to_timestamp("t", F.lit(pattern))).collect()
    for pattern in SPARK_PARSES:
        check_timestamp_format(pattern)
        df.select(F.try_to_timestamp("t", F.lit(pattern))).collect()
    assert duckdb_pattern("MM/dd/yyyy hh:mm a") is None  # 12-hour clocks stay with Spark
    assert duckdb_pattern("yyyyMMdd") is None  # adjacent numbers too
