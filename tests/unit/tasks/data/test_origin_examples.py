"""Point in time, origin by origin, on the in-process engine (DuckDB; Spark SQL runs the same SQL
text and is held equal to it by ``test_features_duckdb.py``): events after the end of an origin's
label window never change that origin's training examples, and a customer first seen after an
origin has no example at it."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.data.cutoffs import Origins, pipeline_cutoffs
from tasks.data.features_duckdb import InProcessFeatures
from tasks.data.validation_duckdb import GOOD_EVENTS_SCHEMA

AS_OF = dt.date(2025, 6, 30)
H = 30
COLUMNS = {"event_type", "quantity", "category", "channel"}
# (customer, days before the split instant u, amount, type, channel): up to five horizons back
past_events = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),
        st.floats(0.0, 5.0 * H, allow_nan=False),
        st.floats(0.0, 500.0, allow_nan=False),
        st.sampled_from(["purchase", "purchase", "view", "return"]),
        st.sampled_from(["web", "app"]),
    ),
    min_size=1,
    max_size=30,
)
# events after u, up to two horizons later, existing or new customers
later_events = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d", "new"]),
        st.floats(1e-3, 2.0 * H, allow_nan=False),
        st.floats(0.0, 500.0, allow_nan=False),
        st.sampled_from(["purchase", "view"]),
        st.sampled_from(["web", "app"]),
    ),
    max_size=30,
)


def _table(spec, u: dt.datetime, sign: float, prefix: str) -> list[dict]:
    return [
        dict(
            zip(
                GOOD_EVENTS_SCHEMA.names,
                (prefix + c, u - sign * dt.timedelta(days=d), amount, kind, 1, "x", channel),
                strict=True,
            )
        )
        for c, d, amount, kind, channel in spec
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    past=past_events,
    later=later_events,
    origins=st.builds(Origins, st.integers(1, 4), st.sampled_from([None, 7, 20, 45])),
    cut=st.integers(0, 3),
)
def test_events_after_an_origins_label_window_never_change_its_examples(past, later, origins, cut):
    """The split instant ``u`` is T or the end of an older origin's label window; customers
    ``L|x`` get the events up to ``u``, ``R|x`` the same and more after it: at every origin
    whose window ends by ``u`` their examples are the same."""
    train = pipeline_cutoffs(AS_OF, H, origins).train
    u = train[min(cut, len(train) - 1)].label_until.replace(tzinfo=dt.UTC)
    rows = _table(past, u, 1.0, "L|") + _table(past, u, 1.0, "R|") + _table(later, u, -1.0, "R|")
    with InProcessFeatures(pa.Table.from_pylist(rows, GOOD_EVENTS_SCHEMA), train, COLUMNS) as f:
        got = f.examples_table(train).to_pylist()
    kept = {c.origin() for c in train if c.label_until.replace(tzinfo=dt.UTC) <= u}
    sides: dict[str, dict] = {"L|": {}, "R|": {}}
    for row in got:
        side, customer = row["customer_id"][:2], row.pop("customer_id")[2:]
        if row["origin"] in kept:
            sides[side][(customer, row.pop("origin"))] = row
    assert set(sides["L|"]) == set(sides["R|"])  # first seen after an origin: no example there
    for key, row in sides["L|"].items():
        assert sides["R|"][key] == pytest.approx(row, rel=1e-12, abs=1e-12), key
    seen = {c for c, _, _, _, _ in past}
    assert {(c, o) for c, o in sides["L|"]} <= {(c, o) for c in seen for o in kept}
