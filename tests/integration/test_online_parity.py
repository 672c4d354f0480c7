"""The online state's features are Spark's too: the features stage's Spark SQL at a cutoff days
after the state's seed equals the online features of every customer (relative 1e-9), for every
column set. (DuckDB's, on many random streams: tests/unit/serving/test_online_features.py.)"""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest

from serving.online.features import online_features
from serving.online.state import end_of_day_micros
from tasks.data.cutoffs import Cutoff, end_of_day
from tasks.data.features import customer_features_at, cutoff_features
from tasks.definitions.contract import CONTRACT_COLUMNS, REQUIRED_COLUMNS
from tasks.definitions.feature_specs import feature_names
from tests.fixtures.online_events import (
    BASE,
    BASE_DAY,
    events_table,
    random_stream,
    seeded_state,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("minimal", [False, True], ids=["all-columns", "minimal-columns"])
def test_online_features_equal_sparks(spark, minimal):
    rows = random_stream(11, 40, 1500, 500, minimal)
    available = set(REQUIRED_COLUMNS) if minimal else set(CONTRACT_COLUMNS)
    seed_day = BASE_DAY - 30
    state = seeded_state(rows, end_of_day_micros(seed_day), 3)
    cutoff_day = BASE_DAY + 10
    cutoff = Cutoff("score", end_of_day(BASE + dt.timedelta(days=10)))
    frame = spark.createDataFrame(events_table(rows).to_pandas()).repartition(2)
    wide = customer_features_at(frame, [cutoff], available)
    expected = {
        r["customer_id"]: r.asDict() for r in cutoff_features(wide, cutoff, available).collect()
    }
    names = feature_names(available)
    ids = sorted(expected)
    got = online_features(state, np.asarray([state.row_of[c] for c in ids]), cutoff_day, names)
    assert len(ids) == 40
    for i, customer in enumerate(ids):
        for j, name in enumerate(names):
            want = expected[customer][name]
            assert math.isclose(got[i, j], want, rel_tol=1e-9, abs_tol=1e-12), (
                customer,
                name,
                got[i, j],
                want,
            )
