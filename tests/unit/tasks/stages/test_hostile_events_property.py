"""A property of the validate and features stages (issue 32): for any events file with rows
dated in the far future or before the floor, NaN, infinite, negative or absurdly large amounts
mixed in, either the run stops with an input error (exit 2) of one line, or the features it
publishes are exactly those of the file without the quarantined rows. Small data, the
in-process engines, few examples."""

from __future__ import annotations

import datetime as dt
import math
import tempfile
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.errors import HybridflowInputError
from infra.storage.datasets import read_dataset_manifest
from infra.storage.store import LocalFolderStore
from tasks.data.validation_sql import RowBounds
from tasks.stages.features import features_stage
from tasks.stages.validate import validate_stage

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
BOUNDS = RowBounds.around(NOW, dt.timedelta(hours=24), dt.date(1970, 1, 1), max_amount=1e12)
START = dt.datetime(2025, 1, 1, 9, tzinfo=dt.UTC)
CUSTOMERS = 12
HORIZON = 60


def _clean_rows() -> list[tuple[str, dt.datetime, float]]:
    """Every customer buys every 9-40 days over a year (some stop early): both label classes."""
    rows = []
    for c in range(CUSTOMERS):
        step, stop = 9 + 3 * c, 365 - (c % 4) * 70
        rows += [
            (f"c{c:02d}", START + dt.timedelta(days=d, hours=c), 5.0 + c + d % 7)
            for d in range(0, stop, step)
        ]
    return rows


POISON = {
    "future": lambda c: (c, dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC), 10.0),
    "soon": lambda c: (c, NOW + dt.timedelta(days=3), 10.0),
    "ancient": lambda c: (c, dt.datetime(1, 1, 1, tzinfo=dt.UTC), 10.0),
    "before_floor": lambda c: (c, dt.datetime(1969, 12, 31, tzinfo=dt.UTC), 10.0),
    "nan": lambda c: (c, START + dt.timedelta(days=100), math.nan),
    "inf": lambda c: (c, START + dt.timedelta(days=100), math.inf),
    "negative": lambda c: (c, START + dt.timedelta(days=100), -3.0),
    "huge": lambda c: (c, START + dt.timedelta(days=200), 1e308),
    "too_large": lambda c: (c, START + dt.timedelta(days=200), 2e12),
}


def _write(path: Path, rows: list[tuple[str, dt.datetime, float]]) -> str:
    table = pa.table(
        {
            "customer_id": [r[0] for r in rows],
            "event_time": pa.array([r[1] for r in rows], pa.timestamp("us", tz="UTC")),
            "amount": pa.array([r[2] for r in rows], pa.float64()),
        }
    )
    pq.write_table(table, path)
    return str(path)


def _published(store: LocalFolderStore, prefix: str) -> list[dict]:
    manifest = read_dataset_manifest(store, prefix)
    folder = store.local_path(manifest.data_prefix)
    table = pa.concat_tables(pq.read_table(folder / Path(f).name) for f in manifest.files)
    return sorted(table.to_pylist(), key=lambda r: (str(r.get("origin")), r["customer_id"]))


def _run(folder: Path, rows: list[tuple[str, dt.datetime, float]]) -> tuple[list, list]:
    store = LocalFolderStore(folder / "store")
    path = _write(folder / "events.parquet", rows)
    validated = validate_stage(None, store, "p", path, 0.5, use_cache=False, bounds=BOUNDS)
    features = features_stage(None, store, "p", validated, None, HORIZON, use_cache=False)
    return _published(store, features.scoring_prefix), _published(store, features.training_prefix)


@lru_cache(maxsize=1)
def _clean_features() -> tuple[list, list]:
    with tempfile.TemporaryDirectory() as tmp:
        return _run(Path(tmp), _clean_rows())


poison_rows = st.lists(
    st.tuples(
        st.sampled_from(sorted(POISON)), st.integers(0, CUSTOMERS + 2), st.integers(0, 10**6)
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(poison=poison_rows)
def test_hostile_rows_are_refused_or_leave_the_features_of_the_clean_file(poison):
    rows = _clean_rows()
    for kind, customer, position in poison:
        rows.insert(position % (len(rows) + 1), POISON[kind](f"c{customer:02d}"))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            got = _run(Path(tmp), rows)
        except HybridflowInputError as exc:
            assert "\n" not in str(exc) and str(exc)
            return
    assert got == _clean_features()
