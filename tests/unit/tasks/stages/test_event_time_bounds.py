"""Event times are bounded (issue 32, item 1): a row dated after the validating clock plus the
lead, or before the floor, is quarantined by its own reason and never becomes the run's as_of;
a cached validation is reused only when it holds for the clock of now; an as_of after the last
event's day needs an explicit flag, and the run says what the label window then holds."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra.errors import HybridflowInputError
from tasks.data.validation_sql import RowBounds
from tasks.stages.features import label_window_note, resolve_as_of
from tasks.stages.validate import validate_stage

FIRST = dt.datetime(2025, 1, 1, 12, tzinfo=dt.UTC)
LAST = dt.datetime(2025, 6, 30, 12, tzinfo=dt.UTC)
NOW = dt.datetime(2025, 7, 1, tzinfo=dt.UTC)


def _bounds(now: dt.datetime) -> RowBounds:
    return RowBounds.around(now, dt.timedelta(hours=24), dt.date(1970, 1, 1))


def _events(path, extra: list[dt.datetime]) -> str:
    """96 good rows from FIRST to LAST (the last at LAST) plus one row at each ``extra`` time."""
    step = dt.timedelta(hours=1)
    times = [FIRST + i * step for i in range(95)] + [LAST] + extra
    table = pa.table(
        {
            "customer_id": [f"c{i % 7}" for i in range(len(times))],
            "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
            "amount": [1.0 + i for i in range(len(times))],
        }
    )
    pq.write_table(table, path)
    return str(path)


def test_future_and_ancient_rows_are_quarantined_and_never_set_the_as_of(local_store, tmp_path):
    far = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)
    ancient = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
    path = _events(tmp_path / "events.parquet", [far, ancient])
    result = validate_stage(None, local_store, "r", path, 0.05, bounds=_bounds(NOW))
    assert result.quarantine_reasons == {"event_time_in_future": 1, "event_time_before_floor": 1}
    assert result.rows_valid == 96 and result.last_event == LAST
    assert resolve_as_of(result, None, 30) == LAST.date()


def test_a_cached_validation_is_redone_when_its_future_rows_fall_due(local_store, tmp_path):
    soon = NOW + dt.timedelta(days=3)
    path = _events(tmp_path / "events.parquet", [soon])
    before = validate_stage(None, local_store, "a", path, 0.05, bounds=_bounds(NOW))
    assert before.quarantine_reasons == {"event_time_in_future": 1}
    again = validate_stage(None, local_store, "b", path, 0.05, bounds=_bounds(NOW))
    assert again.report.cached  # the same clock: nothing to redo
    later = validate_stage(None, local_store, "c", path, 0.05, bounds=_bounds(soon))
    assert not later.report.cached and later.quarantine_reasons == {}
    assert later.last_event == soon
    earlier = validate_stage(None, local_store, "d", path, 0.05, bounds=_bounds(NOW))
    assert not earlier.report.cached  # its newest row is after this clock's ceiling
    assert earlier.quarantine_reasons == {"event_time_in_future": 1}


def test_an_as_of_after_the_last_event_needs_the_flag_and_says_what_the_window_holds(
    local_store, tmp_path
):
    path = _events(tmp_path / "events.parquet", [])
    validated = validate_stage(None, local_store, "r", path, 0.05, bounds=_bounds(NOW))
    late = LAST.date() + dt.timedelta(days=30)
    with pytest.raises(HybridflowInputError) as info:
        resolve_as_of(validated, late, 90)
    message = str(info.value)
    assert "\n" not in message and "--as-of-after-events" in message
    assert f"as_of {late} is 30 day(s) after the last event ({LAST.date()})" in message
    assert "holds events on 60 of its 90 days" in message
    assert resolve_as_of(validated, late, 90, after_events=True) == late
    # the day after the last event's (a nightly run dated today) is within the grace day
    assert resolve_as_of(validated, LAST.date() + dt.timedelta(days=1), 90) > LAST.date()
    assert label_window_note(validated, LAST.date(), 90) is None
