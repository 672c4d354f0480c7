"""New segments of the events log reach Prefect as ``hybridflow.events.landed`` (a real Prefect
API: the test harness's), once each range, with the refresh decision a pipeline run makes; the
reader's position moves only once the event was sent."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest

from flows.events import EVENTS_LANDED, REFRESH_LABEL
from flows.events_log import READER, announce_landed_segments
from infra.storage.events_log import EventsLog
from tests.e2e.stack_driver import wait_for
from tests.fixtures.online_events import BASE, events_table, random_stream
from tests.fixtures.serving_sample import register_sample_model, sample_feature_table

pytestmark = pytest.mark.integration


def test_new_segments_are_announced_once_with_the_refresh_decision(prefect_harness, local_store):
    log = EventsLog(local_store)
    rows = random_stream(5, 10, 60, 20, False)
    for seq, part in enumerate((rows[:20], rows[20:40]), start=1):
        log.append(seq, events_table(part), f"batch-{seq}", "0" * 64)
    register_sample_model(local_store, sample_feature_table(20), seed=1)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=48)  # production is 48 h old by then

    first = announce_landed_segments(local_store, 24.0, now=later)
    assert (first.first, first.last, first.rows, first.refresh) == (1, 2, 40, "new-data")
    assert first.as_of <= BASE
    assert log.reader_position(READER) == 2
    assert announce_landed_segments(local_store, 24.0, now=later) is None  # nothing new

    log.append(3, events_table(rows[40:]), "batch-3", "0" * 64)
    second = announce_landed_segments(local_store, 24.0)  # production is brand new now
    assert (second.first, second.last, second.refresh) == (3, 3, None)

    events = {}
    for landed in (first, second):
        found = wait_for(
            "the landed event",
            lambda landed=landed: [e for e in _landed_all() if e["id"] == landed.event_id],
            timeout=60,
        )
        events[landed.first] = found[0]
    assert events[1]["resource"][REFRESH_LABEL] == "new-data"
    assert events[1]["payload"]["events"] == log.uri
    assert events[1]["payload"]["segments"] == [1, 2] and events[1]["payload"]["rows"] == 40
    assert events[3]["resource"][REFRESH_LABEL] == "none"
    assert (
        events[1]["resource"]["prefect.resource.id"] != events[3]["resource"]["prefect.resource.id"]
    )


def _landed_all() -> list[dict]:
    from prefect.settings import PREFECT_API_URL

    body = {"filter": {"event": {"name": [EVENTS_LANDED]}}, "limit": 50}
    response = httpx.post(f"{PREFECT_API_URL.value()}/events/filter", json=body, timeout=10)
    response.raise_for_status()
    return response.json()["events"]


def test_announced_into_an_events_folder_the_segments_are_there_first(
    prefect_harness, local_store, tmp_path
):
    log = EventsLog(local_store)
    log.append(1, events_table(random_stream(6, 5, 20, 10, False)), "batch-1", "0" * 64)
    folder = tmp_path / "events"
    landed = announce_landed_segments(local_store, 24.0, into=folder)
    assert (folder / "events-log" / "segment-000000000001.parquet").is_file()
    (event,) = wait_for(
        "the landed event",
        lambda: [e for e in _landed_all() if e["id"] == landed.event_id],
        timeout=60,
    )
    assert event["payload"]["events"] == str(folder)
