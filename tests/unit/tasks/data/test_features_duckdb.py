"""The in-process features (DuckDB) are Spark's features: the same customers, the same values
(relative 1e-9) and labels at every pipeline cutoff, for all columns and for the minimal ones."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tasks.data.cutoffs import pipeline_cutoffs
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.data.features import customer_features_at, cutoff_features
from tasks.data.features_duckdb import InProcessFeatures
from tasks.data.validation_duckdb import GOOD_EVENTS_SCHEMA
from tasks.definitions.contract import CONTRACT_COLUMNS, REQUIRED_COLUMNS
from tasks.definitions.feature_specs import feature_names

pytestmark = pytest.mark.integration

AS_OF = dt.date(2025, 6, 30)
EVENT_SCHEMA = GOOD_EVENTS_SCHEMA  # the validated events, as the features stage reads them


def _edge_rows() -> pa.Table:
    """Ties, a lone purchase, nulls in the mix columns, events exactly at and after T."""
    t = dt.datetime(2025, 6, 30, 23, 59, 59, 999999, tzinfo=dt.UTC)
    day = dt.timedelta(days=1)
    rows = [
        ("tie", t - 10 * day, 5.0, "purchase", 2, "a", None),
        ("tie", t - 10 * day, 7.0, "purchase", 3, "b", "web"),
        ("tie", t - 3 * day, 1.0, "view", 1, None, "web"),
        ("lone", t - 200 * day, 9.5, "purchase", 1, "a", "app"),
        ("at-t", t, 3.0, "purchase", 1, "c", "app"),
        ("at-t", t - 95 * day, 3.0, "return", 1, "c", "app"),
        ("later", t + day, 4.0, "purchase", 1, "a", "web"),
        ("views", t - 100 * day, 0.0, "view", 1, None, None),
        ("views", t - 30 * day, 0.0, "add_to_cart", 1, None, None),
    ]
    return pa.Table.from_pylist(
        [dict(zip(EVENT_SCHEMA.names, r, strict=True)) for r in rows], EVENT_SCHEMA
    )


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> pa.Table:
    out = tmp_path_factory.mktemp("duckdb-features") / "events"
    generate_demo_events(DemoDataParams(customers=400, days=500, seed=3), out)
    demo = pq.read_table(out).select(list(CONTRACT_COLUMNS))
    demo = pa.table({f.name: demo[f.name].cast(f.type) for f in EVENT_SCHEMA}, EVENT_SCHEMA)
    amount = demo["amount"]
    valid = pc.and_(
        pc.and_(pc.is_valid(demo["customer_id"]), pc.is_valid(demo["event_time"])),
        pc.and_(pc.is_finite(amount), pc.greater_equal(amount, 0.0)),
    )
    demo = demo.filter(valid)
    quantity = pc.fill_null(demo["quantity"], 1)
    demo = demo.set_column(4, "quantity", quantity).filter(pc.greater_equal(quantity, 1))
    return pa.concat_tables([demo, _edge_rows()])


def _by_customer(rows: list[dict]) -> dict[str, dict]:
    return {r.pop("customer_id"): r for r in rows}


@pytest.mark.parametrize("columns", ["all", "minimal"])
def test_duckdb_and_spark_compute_the_same_features(spark, events, columns):
    available = set(CONTRACT_COLUMNS) if columns == "all" else set(REQUIRED_COLUMNS)
    cutoffs = list(pipeline_cutoffs(AS_OF, 90))
    frame = spark.createDataFrame(events.to_pandas()).repartition(2)
    wide = customer_features_at(frame, cutoffs, available).cache()
    with InProcessFeatures(events, cutoffs, available) as in_process:
        assert in_process.events_after() == wide.groupBy().sum("events_after").first()[0] > 0
        for cutoff in cutoffs:
            got = in_process.cutoff_table(cutoff)
            expected = _by_customer(
                [r.asDict() for r in cutoff_features(wide, cutoff, available).collect()]
            )
            names = feature_names(available) + (["label"] if cutoff.label_until else [])
            assert got.column_names == ["customer_id", *names]
            assert got["customer_id"].to_pylist() == sorted(expected)
            for cid, values in _by_customer(got.to_pylist()).items():
                assert values == pytest.approx(expected[cid], rel=1e-9, abs=1e-9), (cutoff, cid)
    wide.unpersist()


def test_parquet_files_a_stream_and_a_table_give_the_same_features(events, tmp_path):
    half = events.num_rows // 2
    files = [tmp_path / "part-0.parquet", tmp_path / "part-1.parquet"]
    pq.write_table(events.slice(0, half), files[0])
    pq.write_table(events.slice(half), files[1], row_group_size=1000)
    stream = pa.RecordBatchReader.from_batches(events.schema, events.to_batches(max_chunksize=700))
    cutoffs = list(pipeline_cutoffs(AS_OF, 90))
    available = set(CONTRACT_COLUMNS)
    sources = {"table": events, "files": files, "stream": stream}
    tables = {}
    for name, source in sources.items():
        with InProcessFeatures(source, cutoffs, available) as in_process:
            tables[name] = [in_process.cutoff_table(c) for c in cutoffs]
            assert in_process.events_after() > 0
    assert tables["files"] == tables["table"] and tables["stream"] == tables["table"]
    assert [t.num_rows > 50 for t in tables["table"]] == [True] * len(cutoffs), tables["table"]
