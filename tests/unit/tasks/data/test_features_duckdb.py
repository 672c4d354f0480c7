"""The in-process features (DuckDB) are Spark's features: the same customers, the same values
(relative 1e-9) and labels at every pipeline cutoff (every training and backtest origin), the
same training examples with their origins, and the same sequences of each customer's last
events, for all columns and for the minimal ones."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tasks.data.cutoffs import Origins, pipeline_cutoffs
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.data.features import customer_features_at, cutoff_features, examples_features
from tasks.data.features_duckdb import InProcessFeatures, feature_passes, file_passes
from tasks.data.sequences import sequence_fields
from tasks.data.validation_duckdb import GOOD_EVENTS_SCHEMA
from tasks.definitions.contract import CONTRACT_COLUMNS, REQUIRED_COLUMNS
from tasks.definitions.feature_specs import feature_names, present_mix_columns

pytestmark = pytest.mark.integration

AS_OF = dt.date(2025, 6, 30)
ORIGINS = Origins(count=3, stride_days=45)  # strides below H: overlapping label windows
SEQUENCE_LENGTH = 8
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


def _same(got: dict, expected: dict, key) -> None:
    """Numbers equal to 1e-9; the sequence columns (lists, from the same numpy code) exactly."""
    lists = {k for k, v in got.items() if isinstance(v, list)}
    assert {k: got[k] for k in lists} == {k: expected[k] for k in lists}, key
    rest = {k: v for k, v in got.items() if k not in lists}
    assert rest == pytest.approx({k: expected[k] for k in rest}, rel=1e-9, abs=1e-9), key


@pytest.mark.slow(
    reason="the engines' parity on broad demo data: Spark plans the wide features query over six cutoffs, then each cutoff and two origin sets"
)
@pytest.mark.parametrize("columns", ["all", "minimal"])
def test_duckdb_and_spark_compute_the_same_features(tiny_spark, events, columns):
    """... and the same sequences of each customer's last events (N = 8)."""
    available = set(CONTRACT_COLUMNS) if columns == "all" else set(REQUIRED_COLUMNS)
    n = SEQUENCE_LENGTH
    run = pipeline_cutoffs(AS_OF, 90, ORIGINS)
    cutoffs = run.distinct()
    assert len(cutoffs) == 6  # T, T-H, T-H-45 = T-2H (shared with the backtest), ... T-2H-90
    spark = tiny_spark  # interpreted, not re-planned: TINY_INPUT_SPARK_CONF (tests/conftest.py)
    frame = spark.createDataFrame(events.to_pandas()).repartition(2)
    wide = customer_features_at(frame, cutoffs, available, n).cache()
    sequences = [f.name for f in sequence_fields(present_mix_columns(available))]
    with InProcessFeatures(events, cutoffs, available, sequence_length=n) as in_process:
        assert in_process.events_after() == wide.groupBy().sum("events_after").first()[0] > 0
        for cutoff in cutoffs:
            got = in_process.cutoff_table(cutoff)
            expected = _by_customer(
                [r.asDict() for r in cutoff_features(wide, cutoff, available, n).collect()]
            )
            names = feature_names(available) + (["label"] if cutoff.label_until else [])
            assert got.column_names == ["customer_id", *names, *sequences]
            assert got["customer_id"].to_pylist() == sorted(expected)
            for cid, values in _by_customer(got.to_pylist()).items():
                _same(values, expected[cid], (cutoff, cid))
            assert max(got["seq_length"].to_pylist()) == n
        for origins in (run.train, run.backtest):
            got = in_process.examples_table(origins)
            rows = examples_features(wide, origins, available, n).collect()
            expected = {(r["customer_id"], r["origin"]): r.asDict() for r in rows}
            names = ["customer_id", *feature_names(available), "label", "origin", *sequences]
            assert got.column_names == names and got.num_rows == len(expected)
            assert {o.as_py() for o in got["origin"]} == {c.origin() for c in origins}
            for row in got.to_pylist():
                key = (row.pop("customer_id"), row.pop("origin"))
                _same(row, {k: v for k, v in expected[key].items() if k in row}, key)
    wide.unpersist()


def test_parquet_files_a_stream_and_a_table_give_the_same_features(events, tmp_path):
    half = events.num_rows // 2
    files = [tmp_path / "part-0.parquet", tmp_path / "part-1.parquet"]
    pq.write_table(events.slice(0, half), files[0])
    pq.write_table(events.slice(half), files[1], row_group_size=1000)
    stream = pa.RecordBatchReader.from_batches(events.schema, events.to_batches(max_chunksize=700))
    cutoffs = list(pipeline_cutoffs(AS_OF, 90, ORIGINS))
    available = set(CONTRACT_COLUMNS)
    sources = {"table": events, "files": files, "stream": stream}
    tables = {}
    for name, source in sources.items():
        # one thread: the same rows summed in the same order whatever the source (DuckDB adds
        # doubles in parallel in a different order from run to run, the last bits differing)
        with InProcessFeatures(source, cutoffs, available, threads=1) as in_process:
            tables[name] = [in_process.cutoff_table(c) for c in cutoffs]
            assert in_process.events_after() > 0
    assert tables["files"] == tables["table"] and tables["stream"] == tables["table"]
    assert [t.num_rows > 50 for t in tables["table"]] == [True] * len(cutoffs), tables["table"]


def _feature_outputs(features: InProcessFeatures, cutoffs, run) -> tuple:
    """What a features run yields: the table at each cutoff, the training examples, and the
    count of events after the last cutoff."""
    return (
        [features.cutoff_table(c) for c in cutoffs],
        features.examples_table(list(run.train)),
        features.events_after(),
    )


def _assert_same_features(left: tuple, right: tuple) -> None:
    """Two :func:`_feature_outputs` hold the same rows and values (doubles to 1e-9: DuckDB's
    parallel sums add in another order per pass)."""
    left_tables, left_examples, left_after = left
    right_tables, right_examples, right_after = right
    assert left_after == right_after > 0
    pairs = [*zip(left_tables, right_tables, strict=True), (left_examples, right_examples)]
    for a, b in pairs:
        assert a.column_names == b.column_names and a.num_rows == b.num_rows > 50
        for name in a.column_names:
            x, y = a[name].to_pylist(), b[name].to_pylist()
            if pa.types.is_floating(a.schema.field(name).type):
                assert x == pytest.approx(y, rel=1e-9, nan_ok=True), name
            else:
                assert x == y, name


def test_features_in_passes_over_shares_of_customers_equal_one_pass(events, tmp_path):
    """Above ``events_per_pass`` the aggregates are computed a share of the customers at a
    time (what bounds their memory at 30M events): the same customers and features."""
    path = tmp_path / "events.parquet"
    pq.write_table(events, path, row_group_size=2000)
    run = pipeline_cutoffs(AS_OF, 90, ORIGINS)
    cutoffs = list(run)
    available = set(CONTRACT_COLUMNS)
    assert feature_passes(events.num_rows, events.num_rows // 3 - 1) == 4
    got = {}
    for passes, per_pass in (("one", None), ("four", events.num_rows // 3 - 1)):
        with InProcessFeatures([path], cutoffs, available, events_per_pass=per_pass) as f:
            shares = sorted(p.name for p in f._scratch.glob("wide-*.parquet"))
            assert len(shares) == (1 if per_pass is None else 4)
            got[passes] = _feature_outputs(f, cutoffs, run)
    _assert_same_features(got["one"], got["four"])


def test_files_of_whole_customers_are_the_passes_as_they_lie(events, tmp_path):
    """Files that each hold every event of their customers (the good events validated in
    process, a file per share) are the passes themselves, a few files per pass within
    ``events_per_pass``: no events are shared out again, and the features are one pass's."""
    run = pipeline_cutoffs(AS_OF, 90, ORIGINS)
    cutoffs = list(run)
    available = set(CONTRACT_COLUMNS)
    ids = events["customer_id"].to_pylist()
    # any rule that keeps a customer whole: the last file has about half the events
    share = pa.array([min(sum(map(ord, i)) % 6, 3) for i in ids])
    files = []
    for k in range(4):
        path = tmp_path / f"part-{k:05d}.parquet"
        pq.write_table(events.filter(pc.equal(share, k)), path)
        files.append(path)
    rows = [pq.ParquetFile(p).metadata.num_rows for p in files]
    per_pass = rows[0] + rows[1]  # the first two files in one pass, then one file each
    assert file_passes(files, rows, per_pass) == [files[:2], [files[2]], [files[3]]]
    got = {}
    for name, source, customer_files in (("one", files, False), ("by-file", files, True)):
        with InProcessFeatures(
            source, cutoffs, available, events_per_pass=per_pass, customer_files=customer_files
        ) as f:
            if customer_files:
                assert len(list(f._scratch.glob("wide-*.parquet"))) == 3
                assert not (f._scratch / "events").exists()  # nothing shared out
            got[name] = _feature_outputs(f, cutoffs, run)
    _assert_same_features(got["one"], got["by-file"])


def test_file_passes_group_consecutive_files_within_the_events_per_pass(tmp_path):
    files = [tmp_path / f"f{i}" for i in range(5)]
    assert file_passes(files, [3, 3, 5, 9, 1], 6) == [files[:2], [files[2]], [files[3]], [files[4]]]
    assert file_passes(files, [1] * 5, 6) == [files]
    assert file_passes([], [], 6) == []
