"""A request's read of one customer (plain Python: :meth:`OnlineState.read_one`, the formulas
compiled to Python on floats by :mod:`serving.online.scalar_formulas`) gives what the array path and
the batch features stage give, in the cases where a float path is most likely to part from
them: zero denominators, empty windows, a customer seen only after the snapshot, a customer
with a ring of every day, a day's count past a slot's width. (Random streams:
test_online_features.py's property test reads every customer both ways too.)"""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pyarrow as pa
import pytest

from serving.online.days import SLOTS
from serving.online.events import DAY_US, end_of_day_micros, event_arrays
from serving.online.features import ArrayOps, fresh_features, online_features
from serving.online.scalar_formulas import scalar_features
from serving.online.state import OnlineState
from tasks.data.validation_duckdb import GOOD_EVENTS_SCHEMA
from tasks.definitions.contract import CONTRACT_COLUMNS, REQUIRED_COLUMNS
from tasks.definitions.feature_formulas import AGGREGATES, feature_values
from tasks.definitions.feature_specs import feature_names
from tests.fixtures.online_events import BASE_DAY, events_table, random_event
from tests.unit.serving.test_online_features import assert_same_features

NAN = math.nan


def same(a: float, b: float) -> bool:
    """Equal at 1e-12, or both NaN (null), or the same infinity."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)


def corner_aggregates() -> list[dict[str, float]]:
    """Aggregates of customers at the formulas' corners: every denominator zero, nulls
    everywhere a customer without purchases has them, one purchase (no gaps), mix columns
    with no value, windows empty while the lifetime is not."""
    base = {name: 0.0 for name in AGGREGATES}
    t = float(end_of_day_micros(BASE_DAY) - 5 * DAY_US)
    unseen = base | {name: NAN for name in AGGREGATES if name.startswith(("_last", "_first"))}
    no_purchase = base | {
        "_last_t": t,
        "_first_t": t - DAY_US,
        "_n": 3.0,
        "_n_view": 3.0,
        "_last_p_t": NAN,
        "_amount": NAN,
        "_basket_mean": NAN,
        "_basket_max": NAN,
        "_gap_mean": NAN,
        "_gap_std": NAN,
        "_gap_max": NAN,
        "_n_7": 3.0,
        "_n_30": 3.0,
        "_n_90": 3.0,
        "_n_180": 3.0,
        "_n_365": 3.0,
        **{f"_amount_{w}": NAN for w in (7, 30, 90, 180, 365)},
        "_category_clogc": NAN,
        "_channel_clogc": NAN,
    }
    one_purchase_long_ago = no_purchase | {
        "_last_t": t - 400 * DAY_US,
        "_n": 1.0,
        "_n_view": 0.0,
        "_n_p": 1.0,
        "_last_p_t": t - 400 * DAY_US,
        "_amount": 0.0,  # a free purchase: a zero amount, not a null
        "_basket_mean": 1.0,
        "_basket_max": 1.0,
        **{f"_n_{w}": 0.0 for w in (7, 30, 90, 180, 365)},
        "_category_values": 1.0,
        "_category_top": 1.0,
        "_category_total": 1.0,
        "_category_clogc": 0.0,
    }
    gaps = one_purchase_long_ago | {
        "_n_p": 4.0,
        "_gap_mean": 0.5,
        "_gap_std": 0.0,
        "_gap_max": 0.5,
        "_n_p_365": 2.0,
        "_amount_365": 12.5,
    }
    return [unseen, no_purchase, one_purchase_long_ago, gaps]


@pytest.mark.parametrize("case", range(4))
def test_the_formulas_on_python_floats_equal_them_on_arrays_at_their_corners(case):
    aggregates = corner_aggregates()[case]
    assert set(aggregates) == set(AGGREGATES)
    cutoff = end_of_day_micros(BASE_DAY)
    names = feature_names(set(CONTRACT_COLUMNS))
    floats = scalar_features(names, cutoff)(aggregates)  # no division by zero raises
    arrays = {name: np.asarray([v]) for name, v in aggregates.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = feature_values(ArrayOps(arrays), cutoff)
    assert len(floats) == len(names)
    for name, value in zip(names, floats, strict=True):
        assert type(value) is float, name
        assert same(value, float(expected[name][0])), (name, value, expected[name])


def corner_customers() -> tuple[list[dict], list[dict], int]:
    """Seed events (at or before the cutoff) and later ones of customers at the corners."""
    rng = np.random.default_rng(11)
    cutoff = end_of_day_micros(BASE_DAY)
    seed = [
        # events only, no purchase: every purchase denominator is zero
        *(random_event("browser", cutoff - d * DAY_US, rng, False) for d in (1, 2)),
        # one purchase 400 days ago: every window empty, the lifetime not; a free one
        random_event("long_ago", cutoff - 400 * DAY_US, rng, True) | {"amount": 0.0},
        # on more days than slots: a ring of every day
        *(random_event("busy", cutoff - d * DAY_US, rng, True) for d in range(SLOTS + 4)),
    ]
    for e in seed:
        if e["customer_id"] == "browser":
            e["event_type"] = "view"
    later = [
        # seen only in the log, one purchase and nothing in the mix columns
        random_event("newcomer", cutoff + 3 * DAY_US, rng, True),
        random_event("long_ago", cutoff + 2 * DAY_US, rng, True),
    ]
    return seed, later, cutoff


def test_one_customers_read_equals_the_array_read_and_the_batch_stage_at_the_corners():
    seed, later, cutoff = corner_customers()
    state = OnlineState(cutoff)
    state.seed(event_arrays(events_table(seed)))
    state.apply(event_arrays(events_table(later)))
    assert state.every_day_customers == 1
    rows = np.arange(state.customers)
    for day in (BASE_DAY + 3, BASE_DAY + 40, BASE_DAY + 400):
        many = state.read(rows, day).aggregates
        for i in rows.tolist():
            one = state.read_one(i, day).aggregates
            assert set(one) == set(AGGREGATES)
            for name, value in one.items():
                assert type(value) is float, (state.ids[i], name, type(value))
                assert same(value, float(many[name][i])), (state.ids[i], name, value)
        for available in (set(REQUIRED_COLUMNS), set(CONTRACT_COLUMNS)):
            assert_same_features(state, seed + later, day, available)


def test_one_customers_read_keeps_counts_past_a_slots_width():
    stamp = dt.datetime(2025, 6, 1, 12, tzinfo=dt.UTC)
    n = 70_000
    table = pa.table(
        {
            "customer_id": pa.array(["bot"] * n),
            "event_time": pa.array([stamp + dt.timedelta(microseconds=i) for i in range(n)]),
            "amount": pa.array(np.full(n, 0.25)),
            "event_type": pa.array(["purchase"] * n),
            "quantity": pa.array(np.ones(n, dtype=np.int32)),
            "category": pa.nulls(n, pa.string()),
            "channel": pa.nulls(n, pa.string()),
        },
        GOOD_EVENTS_SCHEMA,
    )
    state = OnlineState(end_of_day_micros(BASE_DAY))
    state.seed(event_arrays(table))
    names = ["purchases_7d", "purchases_30d", "amount_30d", "events_365d", "n_purchases"]
    for day in (BASE_DAY, BASE_DAY + 10, BASE_DAY + 100):
        (one,), _ = fresh_features(state, np.asarray([0]), day, names)
        (many,) = online_features(state, np.asarray([0]), day, names)
        assert one.tolist() == many.tolist()
    (one,), _ = fresh_features(state, np.asarray([0]), BASE_DAY, names)
    assert one.tolist() == [0.0, float(n), n * 0.25, float(n), float(n)]
