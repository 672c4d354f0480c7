"""The run's time semantics and the bad-rows policy are plain functions in tasks/data over a
validate result's figures (any object with them), not code inside the stage runners."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pytest

from infra.errors import HybridflowInputError
from infra.settings import HybridflowSettings
from tasks.data.bad_rows import check_bad_fraction
from tasks.data.cutoffs import Cutoff
from tasks.data.time_windows import (
    check_labels,
    event_time_bounds,
    events_after_possible,
    history_too_short,
    label_window_note,
    resolve_as_of,
)

FIRST = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
LAST = dt.datetime(2025, 6, 30, 12, tzinfo=dt.UTC)


@dataclass
class Span:
    first_event: dt.datetime | None = FIRST
    last_event: dt.datetime | None = LAST


@dataclass
class Counts:
    rows_read: int
    rows_valid: int
    rows_quarantined: int
    quarantine_uri: str = "store/quarantine"
    quarantine_reasons: dict[str, int] = field(default_factory=dict)


def test_as_of_defaults_to_the_last_event_and_the_grace_is_passed_in():
    assert resolve_as_of(Span(), None, 30) == LAST.date()
    late = LAST.date() + dt.timedelta(days=5)
    with pytest.raises(HybridflowInputError, match="as-of-after-events"):
        resolve_as_of(Span(), late, 30, grace_days=1)
    assert resolve_as_of(Span(), late, 30, grace_days=5) == late
    assert "label window" in (label_window_note(Span(), late, 30) or "")
    with pytest.raises(HybridflowInputError, match="no valid events"):
        resolve_as_of(Span(None, None), None, 30)


def test_windows_the_features_stage_asks_about():
    early = Cutoff(name="backtest", at=dt.datetime(2024, 12, 1))
    assert history_too_short(Span(), early) is not None
    assert history_too_short(Span(), Cutoff(name="backtest", at=dt.datetime(2025, 3, 1))) is None
    assert events_after_possible(Span(), Cutoff(name="score", at=dt.datetime(2025, 6, 1)))
    assert not events_after_possible(Span(), Cutoff(name="score", at=dt.datetime(2025, 7, 1)))
    with pytest.raises(HybridflowInputError, match="both.*the value --purchase-event names"):
        check_labels(0.0, 10, LAST.date(), 30)


def test_a_log_without_purchases_is_told_its_event_types_and_the_option():
    """No buyer and no purchase anywhere: the error names the types the log has, the most
    first, and --purchase-event (before: only 'all N training labels are 0')."""
    seen = {"view": 900, "checkout": 40, **{f"t{i}": 1 for i in range(9)}}
    with pytest.raises(HybridflowInputError) as caught:
        check_labels(0.0, 10, LAST.date(), 30, lambda: seen)
    message = str(caught.value)
    assert "no event is a purchase" in message and "--purchase-event VALUE" in message
    assert "'view' (900), 'checkout' (40), 't0' (1)" in message and "and 3 more" in message
    assert "params.input.purchase_event" in message
    # purchases exist, none in the horizon: the labels' own error; buyers: no question asked
    with pytest.raises(HybridflowInputError, match="all 10 training labels are 0"):
        check_labels(0.0, 10, LAST.date(), 30, lambda: {"purchase": 3, "view": 9})
    check_labels(0.2, 10, LAST.date(), 30, lambda: pytest.fail("counted without need"))


def test_event_time_bounds_come_from_the_settings_given():
    now = dt.datetime(2025, 7, 1, tzinfo=dt.UTC)
    bounds = event_time_bounds(HybridflowSettings(event_time_max_lead_hours=2), now)
    assert bounds.ceiling == now + dt.timedelta(hours=2)


def test_the_bad_fraction_policy():
    check_bad_fraction(Counts(100, 90, 10), 0.1)
    with pytest.raises(HybridflowInputError, match="over --max-bad-fraction"):
        check_bad_fraction(Counts(100, 89, 11), 0.1)
    with pytest.raises(HybridflowInputError, match="no valid events"):
        check_bad_fraction(Counts(5, 0, 5), 1.0)


def test_too_many_bad_rows_are_explained_reason_by_reason_the_most_first():
    reasons = {"duplicate_event": 10, "invalid_event_time": 440, "missing_customer_id": 250}
    with pytest.raises(HybridflowInputError) as info:
        check_bad_fraction(Counts(1000, 300, 700, quarantine_reasons=reasons), 0.05)
    message = str(info.value)
    assert message.startswith("700 of 1,000 event rows (70.0%) are bad")
    order = [message.index(r) for r in ("invalid_event_time 440 (44.0%", "missing_customer_id 250")]
    assert order == sorted(order) and "duplicate_event 10 (1.0%" in message
    assert "--timestamp-format" in message and "--max-bad-fraction" in message
    assert message.endswith("see store/quarantine")
