"""A customer's last events before a cutoff, padded: the kept events' latest N at or before each
row's cutoff by rank, the most recent first, zeros after; codes stable; rows without events."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tasks.data.sequences import (
    CODE_BUCKETS,
    CUTOFF,
    EVENTS,
    pad_sequences,
    sequence_fields,
    value_code,
)
from tasks.definitions.feature_specs import DAY_MICROS

DAY = int(DAY_MICROS)
EVENT = pa.struct(
    [
        ("i", pa.int64()),
        ("t", pa.int64()),
        ("amount", pa.float64()),
        ("k", pa.int32()),
        ("category", pa.string()),
        ("channel", pa.string()),
    ]
)


def _batch(rows: list[tuple[str, list[dict] | None, int]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "customer_id": [r[0] for r in rows],
            EVENTS: pa.array([r[1] for r in rows], pa.list_(EVENT)),
            CUTOFF: pa.array([r[2] for r in rows], pa.int64()),
        }
    )


def _event(i: int, day: int, amount: float = 1.0, k: int = 1, cat: str | None = "x") -> dict:
    return {"i": i, "t": day * DAY, "amount": amount, "k": k, "category": cat, "channel": None}


def test_the_latest_events_at_or_before_each_rows_cutoff_most_recent_first():
    events = [_event(i, day, amount=float(i), k=1 + i % 4) for i, day in enumerate([1, 3, 3, 7, 9])]
    events = [events[4], events[0], events[2], events[3], events[1]]  # engines keep no order
    out = pad_sequences(
        _batch([("a", events, 7 * DAY), ("a", events, 2 * DAY), ("b", None, 5 * DAY)]),
        3,
        ["category", "channel"],
    ).to_pylist()
    assert [r["seq_length"] for r in out] == [3, 1, 0]
    # cutoff day 7: ranks 3, 2, 1 (days 7, 3, 3; the tie at day 3 ordered by rank)
    assert out[0]["seq_gap_days"] == [0.0, 4.0, 4.0]
    assert out[0]["seq_amount"] == [3.0, 2.0, 1.0]
    assert out[0]["seq_event_type"] == [4, 3, 2]
    assert out[1]["seq_gap_days"] == [1.0, 0.0, 0.0] and out[1]["seq_event_type"] == [1, 0, 0]
    assert out[2]["seq_amount"] == [0.0, 0.0, 0.0] and out[2]["seq_category"] == [0, 0, 0]
    assert out[0]["seq_category"] == [value_code("x")] * 3 and out[0]["seq_channel"] == [0] * 3
    assert list(out[0]) == ["customer_id"] + [
        f.name for f in sequence_fields(["category", "channel"])
    ]


def test_codes_are_stable_and_never_padding():
    assert value_code("electronics") == value_code("electronics")
    codes = {value_code(f"v{i}") for i in range(5000)}
    assert min(codes) >= 1 and max(codes) < CODE_BUCKETS and len(codes) > CODE_BUCKETS // 2


@pytest.mark.parametrize("as_table", [False, True])
def test_an_empty_batch_keeps_its_schema(as_table):
    batch = _batch([])
    got = pad_sequences(pa.Table.from_batches([batch]) if as_table else batch, 4, [])
    assert got.num_rows == 0
    assert got.schema.names == ["customer_id", *(f.name for f in sequence_fields([]))]
