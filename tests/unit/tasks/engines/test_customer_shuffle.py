"""The shuffle by customer through the store (tasks/engines/spark/customer_shuffle.py), as one
task runs it: a file's rows split by customer into Parquet pieces, every customer in exactly
one bucket whatever file its events are in, nothing lost, and pieces hashed by different
hashers refused."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra.storage.store import LocalFolderStore
from tasks.engines.spark.customer_shuffle import bucket_pieces, read_pieces, split_by_customer

SCHEMA = pa.schema(
    [
        pa.field("customer_id", pa.string()),
        pa.field("event_time", pa.timestamp("us", tz="UTC")),
        pa.field("amount", pa.float64()),
    ]
)


def _events(customers: range, day: int) -> pa.Table:
    return pa.table(
        {
            "customer_id": [f"C{c:05d}" for c in customers],
            "event_time": [dt.datetime(2025, 1, day, tzinfo=dt.UTC)] * len(customers),
            "amount": [float(c) for c in customers],
        },
        schema=SCHEMA,
    )


@pytest.fixture
def store(tmp_path):
    store = LocalFolderStore(tmp_path / "store")
    data_prefix = "events/data-1"
    for i, day in enumerate((1, 2)):  # every customer has an event in each file
        path = tmp_path / f"part-{i}.parquet"
        pq.write_table(_events(range(300), day), path)
        store.put_file(f"{data_prefix}/part-{i}.parquet", path)
    return store


def test_every_customer_lands_in_one_bucket_with_all_its_events(store):
    pieces = [
        piece
        for i in (0, 1)
        for piece in split_by_customer(
            store, "events/data-1", f"events/data-1/part-{i}.parquet", SCHEMA, 3, "out/pieces"
        )
    ]
    assert {b for b, _, _ in pieces} == {0, 1, 2}  # 300 customers fill 3 buckets
    buckets = bucket_pieces(
        [{"bucket": b, "key": k, "rows": n, "hasher": "h"} for b, k, n in pieces]
    )
    seen: dict[str, int] = {}
    total = 0
    for bucket, keys in enumerate(buckets):
        assert len(keys) == 2  # a piece from each file
        table = read_pieces([store.local_path(k) for k in keys]).read_all()
        assert table.schema == SCHEMA
        total += table.num_rows
        for customer in table.column("customer_id").to_pylist():
            assert seen.setdefault(customer, bucket) == bucket  # one bucket per customer
        counts = table.group_by("customer_id").aggregate([("event_time", "count")])
        assert set(counts.column("event_time_count").to_pylist()) == {2}  # both its events
    assert total == 600 and len(seen) == 300
    assert sum(n for _, _, n in pieces) == 600


def test_an_empty_file_gives_no_piece(store, tmp_path):
    path = tmp_path / "empty.parquet"
    pq.write_table(SCHEMA.empty_table(), path)
    store.put_file("events/data-1/empty.parquet", path)
    assert (
        split_by_customer(store, "events/data-1", "events/data-1/empty.parquet", SCHEMA, 2, "o")
        == []
    )


def test_pieces_hashed_by_different_hashers_are_refused():
    rows = [
        {"bucket": 0, "key": "a", "rows": 1, "hasher": "duckdb 2.0.1"},
        {"bucket": 0, "key": "b", "rows": 1, "hasher": "duckdb 1.4.0"},
    ]
    with pytest.raises(RuntimeError, match="same duckdb version"):
        bucket_pieces(rows)
    assert bucket_pieces(rows[:1] + [{**rows[1], "hasher": "duckdb 2.0.1", "bucket": 4}]) == [
        ["a"],
        ["b"],
    ]
