"""Feature stage on a few million events: Spark (``tasks.data.features.customer_features``, local[*])
against DuckDB computing the same 46 features with SQL in one process.

Both read the same demo Parquet and write Parquet; the outputs must agree (relative tolerance
1e-6, sums may differ in the last bits from the order of addition). Prints the ratio (Spark
seconds / DuckDB seconds) and each engine's events per second, for a first and a second run. ``BENCH_FEATURES_CUSTOMERS``
sets the size (default 50,000 customers, about 1.07M events).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from tasks.data.contract import CONTRACT_COLUMNS
from tasks.data.feature_specs import (
    DAY_MICROS,
    EVENT_TYPE_MIX,
    MIX_COLUMNS,
    NO_PURCHASE_DAYS,
    WINDOWS_DAYS,
    feature_names,
)

ALL_COLUMNS = set(CONTRACT_COLUMNS)
CUTOFF = dt.datetime(2025, 12, 31, 23, 59, 59, 999999)


def duckdb_feature_sql(events_glob: str, cutoff: dt.datetime) -> str:
    """The feature set of :func:`tasks.data.features.customer_features` as one DuckDB query."""
    ts = f"TIMESTAMPTZ '{cutoff.isoformat(sep=' ')}+00'"
    base = [
        "min(d) AS recency_days",
        "max(d) AS tenure_days",
        "sum(p::DOUBLE) AS n_purchases",
        "min(CASE WHEN p THEN d END) AS _last_purchase_d",
        "sum(CASE WHEN p THEN amount ELSE 0 END) AS purchase_amount_total",
        "avg(CASE WHEN p THEN quantity::DOUBLE END) AS _basket_mean",
        "max(CASE WHEN p THEN quantity::DOUBLE END) AS _basket_max",
        "count(*)::DOUBLE AS n_events",
    ]
    for w in WINDOWS_DAYS:
        base += [
            f"sum((p AND d < {w})::DOUBLE) AS purchases_{w}d",
            f"sum(CASE WHEN p AND d < {w} THEN amount ELSE 0 END) AS amount_{w}d",
            f"sum((d < {w})::DOUBLE) AS events_{w}d",
        ]
    for t in ("purchase", *EVENT_TYPE_MIX):
        base.append(f"avg((event_type = '{t}')::DOUBLE) AS share_{t}")

    def safe_div(num: str, den: str) -> str:
        return f"CASE WHEN {den} > 0 THEN {num} / {den} ELSE 0.0 END"

    mean_gap = f"coalesce(_gap_mean, {NO_PURCHASE_DAYS})"
    last_purchase = f"coalesce(_last_purchase_d, {NO_PURCHASE_DAYS})"
    derived = {
        "purchase_recency_days": last_purchase,
        "purchase_amount_mean": safe_div("purchase_amount_total", "n_purchases"),
        "mean_interpurchase_days": mean_gap,
        "std_interpurchase_days": "coalesce(_gap_std, 0.0)",
        "max_interpurchase_days": f"coalesce(_gap_max, {NO_PURCHASE_DAYS})",
        "purchase_recency_over_gap": f"{last_purchase} / greatest({mean_gap}, 1.0)",
        "trend_30d_vs_365d": f"(purchases_30d * {365 / 30!r}) / (purchases_365d + 1)",
        "trend_90d_vs_365d": f"(purchases_90d * {365 / 90!r}) / (purchases_365d + 1)",
        "trend_amount_90d_vs_365d": f"(amount_90d * {365 / 90!r}) / (amount_365d + 1.0)",
        "basket_size_mean": "coalesce(_basket_mean, 0.0)",
        "basket_size_max": "coalesce(_basket_max, 0.0)",
    }
    for w in WINDOWS_DAYS:
        derived[f"amount_mean_{w}d"] = safe_div(f"amount_{w}d", f"purchases_{w}d")
    for col, plural in MIX_COLUMNS.items():
        derived[f"n_{plural}"] = f"coalesce({col}_n, 0.0)"
        derived[f"top_{col}_share"] = f"coalesce({col}_top / {col}_total, 0.0)"
        derived[f"{col}_entropy"] = f"coalesce(ln({col}_total) - {col}_clogc / {col}_total, 0.0)"
    names = feature_names(ALL_COLUMNS)
    select = ",\n  ".join(f"({derived.get(n, n)})::DOUBLE AS {n}" for n in names)
    mixes = "\n".join(
        f""", mix_{col} AS (
  SELECT customer_id, count(*)::DOUBLE AS {col}_n, max(c) AS {col}_top, sum(c) AS {col}_total,
         sum(c * ln(c)) AS {col}_clogc
  FROM (SELECT customer_id, {col}, count(*)::DOUBLE AS c FROM past
        WHERE {col} IS NOT NULL GROUP BY customer_id, {col})
  GROUP BY customer_id)"""
        for col in MIX_COLUMNS
    )
    joins = " ".join(f"LEFT JOIN mix_{col} USING (customer_id)" for col in MIX_COLUMNS)
    return f"""
WITH past AS (
  SELECT customer_id, event_time,
         (epoch_us({ts}) - epoch_us(event_time)) / {DAY_MICROS!r} AS d,
         event_type = 'purchase' AS p, amount, quantity, event_type, category, channel
  FROM read_parquet('{events_glob}')
  WHERE event_time <= {ts}
), base AS (
  SELECT customer_id, {", ".join(base)} FROM past GROUP BY customer_id
), gaps AS (
  SELECT customer_id, avg(gap) AS _gap_mean, stddev_pop(gap) AS _gap_std, max(gap) AS _gap_max
  FROM (SELECT customer_id,
               (epoch_us(event_time) - epoch_us(lag(event_time) OVER (
                   PARTITION BY customer_id ORDER BY event_time))) / {DAY_MICROS!r} AS gap
        FROM past WHERE p)
  WHERE gap IS NOT NULL GROUP BY customer_id
){mixes}
SELECT customer_id,
  {select}
FROM base LEFT JOIN gaps USING (customer_id) {joins}
"""


def _spark_features(events: Path, out: Path) -> float:
    from infra.settings import HybridflowSettings
    from infra.spark import get_spark
    from tasks.data.features import customer_features

    spark = get_spark(HybridflowSettings())
    spark.range(1000).selectExpr("sum(id)").collect()  # session start-up, not measured
    started = time.perf_counter()
    frame = spark.read.parquet(str(events))
    customer_features(frame, CUTOFF, ALL_COLUMNS).write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - started


def _duckdb_features(events: Path, out: Path) -> float:
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    started = time.perf_counter()
    sql = duckdb_feature_sql(str(events / "*.parquet"), CUTOFF)
    con.execute(f"COPY ({sql}) TO '{out}' (FORMAT parquet)")
    seconds = time.perf_counter() - started
    con.close()
    return seconds


def compare(spark_out: Path, duck_out: Path) -> float:
    """The largest relative difference between the two outputs; raises if they disagree."""
    a = pq.read_table(spark_out).sort_by("customer_id")
    b = pq.read_table(duck_out).sort_by("customer_id")
    if a.column("customer_id").to_pylist() != b.column("customer_id").to_pylist():
        raise AssertionError("Spark and DuckDB computed features for different customers")
    worst = 0.0
    for name in feature_names(ALL_COLUMNS):
        x = a.column(name).to_numpy(zero_copy_only=False).astype(float)
        y = b.column(name).to_numpy(zero_copy_only=False).astype(float)
        if not np.allclose(x, y, rtol=1e-6, atol=1e-6):
            bad = int(np.argmax(np.abs(x - y)))
            raise AssertionError(f"{name} differs: spark {x[bad]} vs duckdb {y[bad]}")
        worst = max(worst, float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1.0))))
    return worst


def main(results_dir: Path) -> list[dict]:
    """Generate events, compute features with both engines, check they agree, report."""
    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    customers = int(os.environ.get("BENCH_FEATURES_CUSTOMERS", "50000"))
    work = Path(tempfile.mkdtemp(prefix="hf-bench-features-"))
    try:
        events = work / "events"
        summary = generate_demo_events(
            DemoDataParams(customers=customers, days=730, seed=3, bad_row_fraction=0.0), events
        )
        timings = []
        for run in ("first", "second"):  # the first Spark run pays JIT and codegen warm-up
            spark_s = _spark_features(events, work / "spark.parquet")
            duck_s = _duckdb_features(events, work / "duckdb.parquet")
            worst = compare(work / "spark.parquet", work / "duckdb.parquet")
            timings.append((run, spark_s, duck_s, worst))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = summary.events
    return [
        {
            "benchmark": f"features ({run} run)",
            "subject": "spark customer_features",
            "baseline": "duckdb SQL",
            "ratio": spark_s / duck_s,
            "events": n,
            "customers": customers,
            "features": len(feature_names(ALL_COLUMNS)),
            "spark_s": spark_s,
            "duckdb_s": duck_s,
            "spark_events_per_s": n / spark_s,
            "duckdb_events_per_s": n / duck_s,
            "max_rel_diff": worst,
        }
        for run, spark_s, duck_s, worst in timings
    ]
