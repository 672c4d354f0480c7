"""The online state's features are the batch features stage's: for random event streams, seeded
at one cutoff and updated in chunks, every customer's features at a later day's cutoff equal
DuckDB's (the in-process engine of the features stage) at that cutoff, relative 1e-9; for every
column set. (Spark's: tests/integration/test_online_parity.py.)"""

from __future__ import annotations

import datetime as dt
import math
import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.online.days import SLOTS
from serving.online.events import DAY_US, end_of_day_micros, event_arrays
from serving.online.features import fresh_features, online_features
from serving.online.state import RING_DAYS, OnlineState, bytes_per_customer
from tasks.data.cutoffs import Cutoff, end_of_day, micros
from tasks.data.features_duckdb import InProcessFeatures
from tasks.data.validation_duckdb import GOOD_EVENTS_SCHEMA
from tasks.definitions.contract import CONTRACT_COLUMNS, REQUIRED_COLUMNS
from tasks.definitions.feature_formulas import AGGREGATES
from tasks.definitions.feature_specs import feature_names
from tests.fixtures.online_events import (
    BASE,
    BASE_DAY,
    events_table,
    random_event,
    random_stream,
    seeded_state,
)


def batch_features(rows: list[dict], cutoff: dt.datetime, available: set[str]) -> dict[str, dict]:
    """The features stage's (DuckDB in process) features at ``cutoff``, by customer."""
    with InProcessFeatures(events_table(rows), [Cutoff("score", cutoff)], available) as features:
        table = features.cutoff_table(Cutoff("score", cutoff))
    return {r.pop("customer_id"): r for r in table.to_pylist()}


def assert_same_features(state: OnlineState, rows, cutoff_day: int, available: set[str]) -> None:
    names = feature_names(available)
    expected = batch_features(
        rows, end_of_day(BASE + dt.timedelta(cutoff_day - BASE_DAY)), available
    )
    assert set(expected) <= set(state.row_of)
    ids = sorted(expected)
    got = online_features(state, np.asarray([state.row_of[c] for c in ids]), cutoff_day, names)
    for i, customer in enumerate(ids):
        # one customer at a time: the request path's scalar evaluation of the same formulas
        (one,), _ = fresh_features(state, np.asarray([state.row_of[customer]]), cutoff_day, names)
        for j, name in enumerate(names):
            want = expected[customer][name]
            assert math.isclose(got[i, j], want, rel_tol=1e-9, abs_tol=1e-12), (
                customer,
                name,
                got[i, j],
                want,
            )
            assert math.isclose(one[j], want, rel_tol=1e-9, abs_tol=1e-12), (customer, name)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**31),
    customers=st.integers(1, 8),
    events=st.integers(1, 120),
    span_days=st.sampled_from([3, 40, 400, 900]),
    seed_back=st.integers(0, 60),
    later_days=st.integers(0, 400),
    chunks=st.integers(1, 4),
    minimal=st.booleans(),
)
def test_online_features_equal_the_batch_stage_at_any_later_cutoff(
    seed, customers, events, span_days, seed_back, later_days, chunks, minimal
):
    rows = random_stream(seed, customers, events, span_days, minimal)
    available = set(REQUIRED_COLUMNS) if minimal else set(CONTRACT_COLUMNS)
    seed_cutoff = end_of_day_micros(BASE_DAY - seed_back)
    state = seeded_state(rows, seed_cutoff, chunks)
    cutoff_day = BASE_DAY + later_days
    assert state.cutoff_day() <= cutoff_day
    assert_same_features(state, rows, cutoff_day, available)


def test_the_cutoff_of_a_day_is_the_batch_stages():
    for day in (BASE_DAY, 0, -3, 20_000):
        date = dt.date(1970, 1, 1) + dt.timedelta(days=day)
        assert end_of_day_micros(day) == micros(end_of_day(date))


def test_a_purchase_29_days_ago_leaves_the_30_day_window_tomorrow():
    rng = np.random.default_rng(0)
    bought = end_of_day_micros(BASE_DAY - 29) - 5 * 3600 * 10**6  # 29 days before BASE
    rows = [
        random_event("c1", bought, rng, True),
        random_event("c1", bought - 300 * DAY_US, rng, True),
    ]
    state = seeded_state(rows, end_of_day_micros(BASE_DAY), 1)
    row = np.asarray([state.row_of["c1"]])
    names = ["purchases_30d", "purchases_365d", "purchase_recency_days"]
    today = online_features(state, row, BASE_DAY, names)[0]
    tomorrow = online_features(state, row, BASE_DAY + 1, names)[0]
    assert today[0] == 1.0 and tomorrow[0] == 0.0
    assert today[1] == tomorrow[1] == 2.0
    assert tomorrow[2] == pytest.approx(today[2] + 1.0)
    assert_same_features(state, rows, BASE_DAY + 1, set(REQUIRED_COLUMNS))


def test_the_ring_drops_days_older_than_the_longest_window_for_every_customer():
    rng = np.random.default_rng(1)
    start = end_of_day_micros(BASE_DAY)
    rows = [random_event("old", start - DAY_US, rng, False)]
    state = seeded_state(rows, start, 1)
    later = [random_event("new", start + (RING_DAYS + 3) * DAY_US, rng, False)]
    state.apply(event_arrays(events_table(later)))
    assert state.ring_day == BASE_DAY + RING_DAYS + 3
    assert_same_features(state, rows + later, BASE_DAY + RING_DAYS + 5, set(CONTRACT_COLUMNS))
    row = np.asarray([state.row_of["old"]])
    assert online_features(state, row, state.ring_day, ["events_365d", "n_events"])[0].tolist() == [
        0.0,
        1.0,
    ]


def test_counts_past_the_ring_cells_width_stay_exact():
    stamp = dt.datetime(2025, 6, 1, 12, tzinfo=dt.UTC)
    n = 70_000  # more events of one customer in one day than a uint16 cell holds
    table = pa.table(
        {
            "customer_id": pa.array(["bot"] * n),
            "event_time": pa.array([stamp + dt.timedelta(microseconds=i) for i in range(n)]),
            "amount": pa.array(np.full(n, 0.5)),
            "event_type": pa.array(["purchase"] * n),
            "quantity": pa.array(np.ones(n, dtype=np.int32)),
            "category": pa.nulls(n, pa.string()),
            "channel": pa.nulls(n, pa.string()),
        },
        GOOD_EVENTS_SCHEMA,
    )
    state = OnlineState(end_of_day_micros(BASE_DAY))
    state.seed(event_arrays(table.slice(0, n // 2)))
    state.apply(event_arrays(table.slice(n // 2)))  # all before the cutoff: skipped
    assert state.customers == 1
    state2 = OnlineState(end_of_day_micros(BASE_DAY))
    state2.seed(event_arrays(table))
    names = ["purchases_30d", "amount_30d"]
    got = online_features(state2, np.asarray([0, 0]), BASE_DAY, names)[0]
    assert got.tolist() == [float(n), n * 0.5]
    one, _ = fresh_features(state2, np.asarray([0]), BASE_DAY, names)
    assert one[0].tolist() == [float(n), n * 0.5]


def test_a_purchase_before_the_customers_last_one_is_found():
    rng = np.random.default_rng(2)
    cutoff = end_of_day_micros(BASE_DAY)
    state = OnlineState(cutoff)
    first = random_event("c1", cutoff + 10 * DAY_US, rng, True)
    state.apply(event_arrays(events_table([first])))
    late = [
        random_event("c1", cutoff + 5 * DAY_US, rng, True),
        random_event("c2", cutoff + DAY_US, rng, True),
    ]
    assert state.purchase_order_breaks(event_arrays(events_table(late))).tolist() == [True, False]


def test_bytes_per_customer_are_bounded():
    lifetime = 3 * 8 + 5 * 4 + 6 * 8
    slots = SLOTS * (2 + 2 + 2 + 8) + 4
    assert bytes_per_customer() == lifetime + slots  # 544
    assert bytes_per_customer(every_day=True) == lifetime + slots + 365 * (2 + 2 + 8)
    state = OnlineState(end_of_day_micros(BASE_DAY), capacity=1000)
    assert state.nbytes() == 1024 * bytes_per_customer()


def test_a_customer_active_on_more_days_than_slots_moves_to_a_ring_of_every_day():
    rng = np.random.default_rng(4)
    cutoff = end_of_day_micros(BASE_DAY)
    busy = [random_event("busy", cutoff - d * DAY_US, rng, True) for d in range(SLOTS + 5)]
    quiet = [random_event("quiet", cutoff - d * DAY_US, rng, True) for d in (1, 50, 300)]
    rows = busy + quiet
    state = OnlineState(cutoff)
    state.seed(event_arrays(events_table(rows[: SLOTS - 2] + quiet)))
    assert state.every_day_customers == 0
    state2 = seeded_state(rows, end_of_day_micros(BASE_DAY - SLOTS - 3), 3)
    assert state2.every_day_customers == 1
    assert_same_features(state2, rows, BASE_DAY + 40, set(CONTRACT_COLUMNS))


def test_the_state_reads_every_declared_aggregate_and_no_other():
    state = seeded_state(random_stream(5, 3, 30, 400, False), end_of_day_micros(BASE_DAY), 1)
    assert set(state.aggregates(np.arange(state.customers), BASE_DAY)) == set(AGGREGATES)


def test_a_customer_read_while_chunks_are_applied_is_never_half_updated():
    start = end_of_day_micros(BASE_DAY)
    state = OnlineState(start)
    state.seed(
        event_arrays(
            events_table([random_event("steady", start - DAY_US, np.random.default_rng(3), True)])
        )
    )
    chunks = []
    for k in range(400):
        t0 = start + 1 + k * 60_000_000  # a minute apart: all within the 7-day window
        rows = [
            {
                "customer_id": c,
                "event_time": dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
                + dt.timedelta(microseconds=t0 + i),
                "amount": 1.0,
                "event_type": "purchase",
                "quantity": 1,
                "category": "a",
                "channel": None,
            }
            for i, c in enumerate(["busy", "busy", f"new{k}", "busy"])
        ]
        chunks.append(event_arrays(events_table(rows)))
    done = threading.Event()
    torn: list[tuple] = []

    def applying() -> None:
        for chunk in chunks:
            state.apply(chunk)
        done.set()

    writer = threading.Thread(target=applying)
    writer.start()
    reads = 0
    while not done.is_set() or reads < 50:
        row = state.row_of.get("busy")
        if row is None:
            continue
        a = state.read_one(row, 0).aggregates
        values = (a["_n"], a["_n_p"], a["_n_7"], a["_amount"], a["_amount_7"], a["_category_total"])
        if len(set(values)) != 1:
            torn.append(values)
        reads += 1
    writer.join()
    assert torn == []
    assert state.read_one(state.row_of["busy"], 0).aggregates["_n"] == 3 * len(chunks)


def test_a_ring_goes_back_to_the_pool_when_its_customer_goes_quiet():
    rng = np.random.default_rng(9)
    cutoff = end_of_day_micros(BASE_DAY)
    # events on SLOTS + 5 days: the 5 oldest leave the window 300 days later
    busy = [random_event("busy", cutoff - d * DAY_US, rng, True) for d in range(60, 60 + SLOTS)]
    busy += [random_event("busy", cutoff - d * DAY_US, rng, True) for d in range(360, 365)]
    state = seeded_state(busy, cutoff, 1)
    assert state.every_day_customers == 1
    pool = state.nbytes()
    later = [random_event("other", cutoff + 100 * DAY_US, rng, True)]
    state.apply(event_arrays(events_table(later)))
    assert state.every_day_customers == 0  # its 5 oldest days left: 32 left, back in slots
    assert_same_features(state, busy + later, BASE_DAY + 100, set(REQUIRED_COLUMNS))
    assert_same_features(state, busy + later, BASE_DAY + 330, set(REQUIRED_COLUMNS))
    # the next busy customer takes the ring handed back: the pool does not grow
    start = cutoff + 101 * DAY_US
    other = [random_event("next", start + d * DAY_US, rng, True) for d in range(SLOTS + 3)]
    state.apply(event_arrays(events_table(other)))
    assert state.every_day_customers == 1
    assert state.nbytes() == pool
    last = BASE_DAY + 101 + SLOTS + 2
    assert_same_features(state, busy + later + other, last, set(REQUIRED_COLUMNS))
