"""The CPU part of the pipeline as one DuckDB process: the baseline the Spark stages are
measured against (``bench_features``, ``bench_prepare``, ``bench_run``).

Same definitions as the project (the feature list from :mod:`tasks.definitions.feature_specs`, the
contract's rules from :mod:`tasks.definitions.contract`), written as SQL: drop bad and duplicate rows,
features at T-H with labels "purchased in (T-H, T]", features at T, the backtest's examples
(features at T-2H, labels in (T-2H, T-H]), the customer split and the normaliser's statistics
of both snapshots. ``python -m bench.duckdb_baseline --events PATH`` runs it alone.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from tasks.definitions.contract import CONTRACT_COLUMNS
from tasks.definitions.feature_specs import (
    DAY_MICROS,
    EVENT_TYPE_MIX,
    MIX_COLUMNS,
    NO_PURCHASE_DAYS,
    WINDOWS_DAYS,
    feature_names,
)

ALL_COLUMNS = set(CONTRACT_COLUMNS)


def _ts(at: dt.datetime) -> str:
    return f"TIMESTAMPTZ '{at.isoformat(sep=' ')}+00'"


def clean_events_sql(source_glob: str) -> str:
    """The input's good rows once each: the contract's rules and exact-duplicate removal."""
    return f"""
SELECT DISTINCT * FROM (
  SELECT trim(CAST(customer_id AS VARCHAR)) AS customer_id,
         CAST(event_time AS TIMESTAMPTZ) AS event_time,
         TRY_CAST(amount AS DOUBLE) AS amount,
         coalesce(nullif(trim(CAST(event_type AS VARCHAR)), ''), 'purchase') AS event_type,
         coalesce(TRY_CAST(quantity AS INTEGER), 1) AS quantity,
         nullif(trim(CAST(category AS VARCHAR)), '') AS category,
         nullif(trim(CAST(channel AS VARCHAR)), '') AS channel,
         TRY_CAST(quantity AS DOUBLE) AS q_raw
  FROM read_parquet('{source_glob}'))
WHERE customer_id IS NOT NULL AND customer_id <> '' AND event_time IS NOT NULL
  AND amount IS NOT NULL AND NOT isnan(amount) AND NOT isinf(amount) AND amount >= 0
  AND (q_raw IS NULL OR (q_raw = floor(q_raw) AND q_raw >= 1))
"""


def feature_sql(table: str, cutoff: dt.datetime) -> str:
    """The 46 features at ``cutoff`` (events ``<= cutoff``) of every customer seen by then."""
    ts = _ts(cutoff)
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
  FROM {table}
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


def training_sql(table: str, cutoff: dt.datetime, label_until: dt.datetime) -> str:
    """Features at ``cutoff`` with the label "purchased in (cutoff, label_until]"."""
    return f"""
SELECT f.*, CASE WHEN b.customer_id IS NULL THEN 0.0 ELSE 1.0 END AS label
FROM ({feature_sql(table, cutoff)}) f
LEFT JOIN (SELECT DISTINCT customer_id FROM {table}
           WHERE event_type = 'purchase' AND event_time > {_ts(cutoff)}
             AND event_time <= {_ts(label_until)}) b USING (customer_id)
"""


def split_sql(table: str, seed: int) -> str:
    """Customers' split by a hash of id and seed (70 / 15 / 15), like the preprocess stage."""
    bucket = f"(hash(customer_id, {seed}) % 10000) / 10000.0"
    return f"""
SELECT *, CASE WHEN {bucket} < 0.70 THEN 'train' WHEN {bucket} < 0.85 THEN 'val'
               ELSE 'test' END AS split
FROM {table}
"""


def normalizer_sql(table: str) -> str:
    """Mean and population std of sign(x)*ln(1+|x|) per feature over the train split."""
    stats = []
    for n in feature_names(ALL_COLUMNS):
        x = f"sign({n}) * ln(1 + abs({n}))"
        stats += [f"avg({x}) AS m_{n}", f"stddev_pop({x}) AS s_{n}"]
    return f"SELECT {', '.join(stats)} FROM {table} WHERE split = 'train'"


def prepare(
    con: Any,
    source_glob: str,
    horizon_days: int,
    out: Path,
    as_of: dt.date | None = None,
    seed: int = 7,
) -> dict[str, Any]:
    """Clean events, training examples (T-H, labelled), scoring features (T), the backtest's
    examples (T-2H, labelled), split and normaliser of both snapshots: the validate + features +
    preprocess job. Writes Parquet under ``out``;
    ``as_of`` defaults to the last valid event's date."""
    out.mkdir(parents=True, exist_ok=True)
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"CREATE OR REPLACE TEMP TABLE events AS {clean_events_sql(source_glob)}")
    if as_of is None:
        as_of = con.execute("SELECT max(event_time) FROM events").fetchone()[0].date()
    at = dt.datetime.combine(as_of, dt.time.max)
    horizon = dt.timedelta(days=horizon_days)
    for name, cutoff in (("", at - horizon), ("backtest_", at - 2 * horizon)):
        examples = training_sql("events", cutoff, cutoff + horizon)
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name}examples AS {examples}")
        snapshot = split_sql(f"{name}examples", seed)
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name}snapshot AS {snapshot}")
        con.execute(
            f"COPY {name}snapshot TO '{out / f'{name}snapshot'}' "
            "(FORMAT parquet, PARTITION_BY (split))"
        )
    con.execute(
        f"COPY ({feature_sql('events', at)}) TO '{out / 'scoring.parquet'}' (FORMAT parquet)"
    )
    normalizer = con.execute(normalizer_sql("snapshot")).fetchone()
    backtest_normalizer = con.execute(normalizer_sql("backtest_snapshot")).fetchone()
    counts = con.execute(
        "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM examples), "
        "(SELECT avg(label) FROM examples)"
    ).fetchone()
    return {
        "as_of": as_of.isoformat(),
        "events": counts[0],
        "n_training": counts[1],
        "positive_rate": counts[2],
        "normalizer": list(normalizer),
        "backtest_normalizer": list(backtest_normalizer),
    }


def main() -> None:
    """Run the DuckDB preparation alone and print its figures as JSON."""
    import duckdb

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", required=True, help="a Parquet file or folder")
    parser.add_argument("--out", required=True)
    parser.add_argument("--horizon-days", type=int, default=90)
    args = parser.parse_args()
    events = Path(args.events)
    glob = str(events / "**" / "*.parquet") if events.is_dir() else str(events)
    started = time.perf_counter()
    con = duckdb.connect()
    figures = prepare(con, glob, args.horizon_days, Path(args.out))
    figures["seconds"] = time.perf_counter() - started
    figures.pop("normalizer")
    figures.pop("backtest_normalizer")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
