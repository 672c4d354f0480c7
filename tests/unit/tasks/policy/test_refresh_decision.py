"""When a pipeline run's data asks for a refresh: drift, or new data for a stale production."""

from __future__ import annotations

import datetime as dt

import pytest

from infra.storage.registry import AliasChange, AliasRecord
from tasks.policy.refresh import production_age_hours, refresh_decision

NOW = dt.datetime(2026, 1, 10, 12, 0, tzinfo=dt.UTC)


def _alias(hours_ago: float) -> AliasRecord:
    moved = NOW - dt.timedelta(hours=hours_ago)
    older = AliasChange(version="m-0", at=moved - dt.timedelta(days=30), reason="first")
    latest = AliasChange(version="m-1", at=moved, reason="better")
    return AliasRecord(alias="production", version="m-1", history=[older, latest])


def _decide(drifted=False, new_data=True, alias=None, max_age=24.0):
    return refresh_decision(
        drifted=drifted, new_data=new_data, alias=alias, now=NOW, max_age_hours=max_age
    )


def test_age_counts_from_the_latest_move_of_production():
    assert production_age_hours(_alias(30), NOW) == pytest.approx(30)
    assert production_age_hours(None, NOW) is None
    assert production_age_hours(AliasRecord(alias="p", version="v"), NOW) is None


def test_drift_asks_for_a_refresh_whatever_the_age():
    decision = _decide(drifted=True, new_data=False, alias=_alias(1))
    assert decision.reason == "drift" and decision.production_version == "m-1"


def test_new_data_asks_for_one_only_when_production_is_older_than_the_setting():
    stale = _decide(alias=_alias(30))
    assert stale.reason == "new-data"
    assert stale.explanation == "new data and production is 30.0h old (> 24h)"
    fresh = _decide(alias=_alias(23))
    assert fresh.reason is None and "23.0h old (<= 24h)" in fresh.explanation
    assert _decide(alias=_alias(23), max_age=12).reason == "new-data"


def test_the_same_data_again_or_no_production_skips_the_refresh():
    assert _decide(new_data=False, alias=_alias(300)).reason is None
    assert _decide(new_data=False, alias=_alias(300)).explanation == "no drift and no new data"
    nothing = _decide(alias=None)
    assert nothing.reason is None and nothing.explanation == "no production model to refresh"


def test_one_reason_per_run_drift_first():
    assert _decide(drifted=True, alias=_alias(300)).reason == "drift"
