"""The events log's new segments as ``hybridflow.events.landed``, so the refresh triggers of
``prefect.yaml`` fire from streamed events as they do from a pipeline run's files.

The endpoint never imports Prefect: it only writes segments to the store. This reader, run by
``hybridflow events watch`` beside the Prefect server, follows the log from the position it
recorded in the store (``events-log/readers/prefect-events.json``), emits one event for the
segments that landed since, with the refresh decision of a pipeline run (new data: a refresh
when production is older than ``HYBRIDFLOW_REFRESH__MAX_PRODUCTION_AGE_HOURS``), and records its
new position only once the event was sent: a segment is announced at least once.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from flows.events import emit, log_segments_landed
from infra.storage.events_log import EventsLog, export_into
from infra.storage.registry import ModelRegistry
from infra.storage.store import ObjectStore
from tasks.policy.refresh import refresh_decision

log = logging.getLogger(__name__)
READER = "prefect-events"


class LandedSegments(BaseModel):
    """What one pass announced: segments ``first`` to ``last``, their rows, the newest
    event's date, the refresh reason (None: skipped) and the event's id."""

    first: int
    last: int
    rows: int
    as_of: dt.date
    refresh: str | None
    event_id: str


def announce_landed_segments(
    store: ObjectStore,
    max_production_age_hours: float,
    now: dt.datetime | None = None,
    into: Path | None = None,
) -> LandedSegments | None:
    """Emit ``hybridflow.events.landed`` for the segments since the last announced one; None
    when there are none, or when no Prefect API took the event (announced again next time).
    ``into``: an events folder the segments are first exported into
    (:func:`infra.storage.events_log.export_into`); the event then names that folder, so a refresh it
    starts reads the original events and the streamed ones."""
    events_log = EventsLog(store)
    if into is not None:
        export_into(events_log, into)
    done = events_log.reader_position(READER)
    infos = []
    while (info := events_log.read_info(done + len(infos) + 1)) is not None:
        infos.append(info)
    if not infos:
        return None
    first, last = infos[0].seq, infos[-1].seq
    newest = max(i.last_event_us for i in infos)
    as_of = (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=newest)).date()
    rows = sum(i.rows for i in infos)
    decision = refresh_decision(
        drifted=False,
        new_data=True,
        alias=ModelRegistry(store).alias(),
        now=now or dt.datetime.now(dt.UTC),
        max_age_hours=max_production_age_hours,
    )
    events = str(into) if into is not None else events_log.uri
    spec = log_segments_landed(
        events, first, last, [i.segment_id for i in infos], as_of, rows, decision
    )
    event_id = emit(spec)
    if event_id is None:
        return None
    events_log.record_reader_position(READER, last)
    log.info(
        "segments %d-%d of the events log landed (%d events, newest %s): refresh %s",
        first,
        last,
        rows,
        as_of,
        decision.reason or "skipped",
    )
    return LandedSegments(
        first=first, last=last, rows=rows, as_of=as_of, refresh=decision.reason, event_id=event_id
    )


def watch_landed_segments(
    store: ObjectStore,
    max_production_age_hours: float,
    interval_s: float,
    into: Path | None = None,
    keep_going: Callable[[], bool] = lambda: True,
) -> None:
    """Announce new segments every ``interval_s`` while ``keep_going()``; a failed pass (the
    store or the API away) is logged and tried again."""
    while keep_going():
        try:
            announce_landed_segments(store, max_production_age_hours, into=into)
        except Exception:
            log.exception("announcing the events log's new segments failed")
        time.sleep(interval_s)
