"""The endpoint's online features: the online state of the served snapshot, kept up with the
events log, and ingestion, which appends a batch to the log before it answers.

One :class:`Follower` (a state and how far into the log it is) serves at a time. When the
served snapshot changes, a new follower is seeded off to the side from the events that
snapshot was computed from (:class:`infra.storage.datasets.SourceEvents`), replays the log and is
swapped in; until then the old one keeps serving. Every change to a follower's state goes
through one lock, held by ingestion (catch up, check, append, apply) and by tailing (catch up),
so a replica applies the log's segments once each, in order, whoever wrote them.
"""

from __future__ import annotations

import collections
import datetime as dt
import hashlib
import io
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from infra.settings import IngestSettings
from infra.storage.datasets import SourceEvents
from infra.storage.events_log import SEGMENT_SCHEMA, EventsLog, SegmentInfo, encode_segment
from infra.storage.store import ObjectStore, PreconditionFailed
from serving.metrics import ServingMetrics
from serving.online.delta import Delta, delta_of
from serving.online.events import DAY_US, EventArrays, event_arrays
from serving.online.ingest import (
    REASON_BEFORE_SNAPSHOT,
    REASON_IN_THE_FUTURE,
    REASON_PURCHASE_OUT_OF_ORDER,
    CheckedEvents,
    check_contract,
    parse_events,
    refused,
)
from serving.online.state import OnlineState
from serving.snapshot import FeatureSnapshot
from tasks.definitions.feature_specs import FEATURE_SPECS

log = logging.getLogger(__name__)
RATE_WINDOW_S = 60.0
APPEND_ATTEMPTS = 100
ONLINE_FEATURES = frozenset(spec.name for spec in FEATURE_SPECS)
_IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9._:-]{1,200}")


@dataclass
class Follower:
    """One online state and how far into the log it is: the last segment applied and every
    segment id seen (id -> number, content sha256, rows)."""

    state: OnlineState
    source: SourceEvents
    seq: int = 0
    segments: dict[str, tuple[int, str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class OnlineView:
    """What a request reads: the state, and the earliest day its features are computed at
    (today's under the wall clock; the state's newest event may be later)."""

    state: OnlineState
    at_least_day: int


class OnlineFeatures:
    """The online state of the served snapshot, the log it follows, ingestion into it."""

    def __init__(
        self,
        store: ObjectStore,
        settings: IngestSettings,
        metrics: ServingMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.log = EventsLog(store)
        self._store = store
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._write = threading.Lock()  # the one applier of the log: ingest, tail, swap
        self._sync = threading.Lock()  # one seed or catch-up pass at a time
        self.follower: Follower | None = None
        self.status = "on" if settings.online else "off: HYBRIDFLOW_SERVE__INGEST__ONLINE=false"
        self._refused_source: SourceEvents | None = None
        self._caught_up_at: float | None = None
        self._accepted: collections.deque[tuple[float, int]] = collections.deque()
        self._applied: collections.deque[tuple[float, int]] = collections.deque()
        metrics.online_lag.set_function(self.lag_seconds)

    # following the snapshot and the log

    def sync(self, snapshot: FeatureSnapshot | None) -> None:
        """Follow the served ``snapshot``: seed a new state when its events differ from the
        current state's, then apply the log's new segments."""
        if not self._settings.online:
            return
        with self._sync:
            source = snapshot.source if snapshot is not None else None
            current = self.follower
            if source is None:
                if current is not None:
                    log.warning("the served snapshot names no events: online features off")
                self.follower = None
                self.status = (
                    "off: no feature snapshot yet"
                    if snapshot is None
                    else f"off: snapshot as_of {snapshot.as_of} names no events to seed from"
                )
                return
            if current is None or current.source != source:
                if source == self._refused_source:  # refused once: follow the log meanwhile
                    if current is not None:
                        with self._write:
                            self._catch_up(current)
                    return
                self.status = "seeding" if current is None else self.status
                try:
                    fresh = self._seeded(source)
                except Exception as exc:  # keep serving what there is; retried on a new snapshot
                    self._refused_source = source
                    reason = f"cannot seed from {source.events_data_prefix}: {exc}"
                    self.status = f"off: {reason}" if current is None else f"stale: {reason}"
                    self._metrics.reload_failures.labels("online", "seed_error").inc()
                    log.error("online state not seeded: %s", reason)
                    return
                with self._write:
                    self._catch_up(fresh)
                    self.follower = fresh
                self._refused_source = None
                self.status = "on"
                log.info(
                    "online state seeded at %s: %d customers, log position %d",
                    iso_time(source.cutoff_micros),
                    fresh.state.customers,
                    fresh.seq,
                )
                return
            with self._write:
                self._catch_up(current)

    def _seeded(self, source: SourceEvents) -> Follower:
        """A follower seeded with the source's events up to its cutoff, caught up with the log
        (without the write lock: ingestion goes on meanwhile, the swap catches up the rest)."""
        started = time.perf_counter()
        keys = sorted(
            k for k in self._store.list(source.events_data_prefix) if k.endswith(".parquet")
        )
        if not keys:
            raise FileNotFoundError(
                f"{self._store.key_uri(source.events_data_prefix)} has no files"
            )
        tables = [_read_events(self._store, key) for key in keys]
        events = pa.concat_tables(tables)
        customers = pc.count_distinct(events.column("customer_id")).as_py()
        state = OnlineState(source.cutoff_micros, capacity=customers + customers // 8 + 1024)
        state.seed(event_arrays(events))
        follower = Follower(state, source)
        self._catch_up(follower)
        log.info(
            "seeded %d customers from %d events in %.1fs",
            state.customers,
            events.num_rows,
            time.perf_counter() - started,
        )
        return follower

    def _catch_up(self, follower: Follower) -> None:
        while (segment := self.log.read(follower.seq + 1)) is not None:
            self._apply(follower, segment.info, event_arrays(segment.events))
        if follower is self.follower or self.follower is None:
            self._caught_up_at = self._clock()

    def _apply(
        self,
        follower: Follower,
        info: SegmentInfo,
        events: EventArrays,
        delta: Delta | None = None,
        code_rows: np.ndarray | None = None,
    ) -> None:
        """Apply a segment's events (its per-customer sums ``delta`` when computed already);
        ``code_rows``: the rows of its customers' codes looked up a moment ago."""
        state = follower.state
        after = events.t > state.seed_cutoff
        if not after.all():  # the snapshot's own events (a segment older than it)
            events, delta = events.take(after), None
        if delta is None:
            delta = delta_of(events)
        state.apply_delta(delta, state.group_rows(delta, code_rows))
        applied = delta.events
        follower.seq = info.seq
        follower.segments[info.segment_id] = (info.seq, info.content_sha256, info.rows)
        self._note(self._applied, applied)
        self._metrics.events_applied.inc(applied)
        self._metrics.online_position.set(info.seq)
        self._metrics.online_customers.set(follower.state.customers)
        self._metrics.online_bytes.set(follower.state.nbytes())
        self._metrics.online_newest.set(follower.state.newest / 1e6)

    # ingestion

    def ingest(self, body: bytes, content_type: str, idempotency_key: str | None) -> dict:
        """Check a batch, append it to the log as one segment and apply it; the answer.
        :class:`serving.online.ingest.IngestError` when anything is wrong (nothing applied)."""
        if idempotency_key is not None and not _IDEMPOTENCY_KEY.fullmatch(idempotency_key):
            raise refused("idempotency-key", "1 to 200 of A-Z a-z 0-9 . _ : -")
        checked = check_contract(parse_events(body, content_type))
        if (problem := checked.problem()) is not None:
            self._metrics.events_ingested.labels("refused").inc(checked.rows)
            raise problem
        sha = hashlib.sha256(body).hexdigest()
        segment_id = idempotency_key or f"sha256:{sha}"
        arrays = event_arrays(checked.events)
        ordered, ordered_arrays = checked.events, arrays
        if not (np.diff(arrays.t) >= 0).all():  # a segment is in time order; sent so, often
            order = np.argsort(arrays.t, kind="stable")
            ordered = checked.events.take(pa.array(order))
            ordered_arrays = arrays.take(order, permutation=True)
        # summed per customer and encoded before the lock: another batch may be checked and
        # applied meanwhile
        delta = delta_of(ordered_arrays)
        segment = encode_segment(ordered, segment_id, sha)
        with self._write:
            follower = self.follower
            if follower is None:
                raise refused("online", f"no online state ({self.status})", status=503)
            for _ in range(APPEND_ATTEMPTS):
                self._catch_up(follower)
                if segment_id in follower.segments:
                    return self._repeated(follower, segment_id, sha)
                code_rows = follower.state.code_rows(arrays.customer)
                known = code_rows[arrays.customer.codes]
                online = self._online_checks(follower, checked, arrays, known)
                if (problem := online.problem()) is not None:
                    self._metrics.events_ingested.labels("refused").inc(online.rows)
                    raise problem
                try:
                    info = self.log.put(follower.seq + 1, segment)
                except PreconditionFailed:
                    continue  # another replica took that number: read it, check again
                self._apply(follower, info, ordered_arrays, delta, code_rows)
                self._note(self._accepted, info.rows)
                self._metrics.events_ingested.labels("accepted").inc(info.rows)
                return self._answer(follower, info.seq, segment_id, info.rows, duplicate=False)
        raise refused("log", f"the log moved on {APPEND_ATTEMPTS} times in a row", status=503)

    def _online_checks(
        self, follower: Follower, checked: CheckedEvents, arrays: EventArrays, known: np.ndarray
    ) -> CheckedEvents:
        state = follower.state
        latest = int((self._clock() + self._settings.max_lead_s) * 1e6)
        out_of_order = state.purchase_order_breaks(arrays, known)
        return (
            checked.refuse_where(arrays.t <= state.seed_cutoff, REASON_BEFORE_SNAPSHOT)
            .refuse_where(arrays.t > latest, REASON_IN_THE_FUTURE)
            .refuse_where(out_of_order, REASON_PURCHASE_OUT_OF_ORDER)
        )

    def _repeated(self, follower: Follower, segment_id: str, sha: str) -> dict:
        seq, first_sha, rows = follower.segments[segment_id]
        if first_sha != sha:
            raise refused(
                "idempotency-key",
                f"{segment_id!r} was used for a different batch (segment {seq})",
                status=409,
            )
        self._metrics.events_ingested.labels("duplicate").inc(rows)
        return self._answer(follower, seq, segment_id, rows, duplicate=True)

    def _answer(
        self, follower: Follower, seq: int, segment_id: str, rows: int, duplicate: bool
    ) -> dict:
        return {
            "accepted": rows,
            "duplicate": duplicate,
            "segment": seq,
            "segment_id": segment_id,
            "log_position": follower.seq,
            "features_as_of": iso_time(follower.state.newest),
        }

    # reads

    def view(self, features: tuple[str, ...]) -> OnlineView | None:
        """The state a request scores from, None when there is none or it cannot compute
        every one of ``features``."""
        follower = self.follower
        if follower is None or not ONLINE_FEATURES.issuperset(features):
            return None
        day = int(self._clock() * 1e6) // DAY_US if self._settings.clock == "wall" else 0
        return OnlineView(follower.state, day)

    def lag_seconds(self) -> float:
        """Seconds since this replica last had every segment of the log (0 before it had)."""
        return 0.0 if self._caught_up_at is None else max(self._clock() - self._caught_up_at, 0.0)

    def report(self) -> dict:
        """The online part of ``/ready``."""
        follower = self.follower
        body: dict[str, object] = {"status": self.status}
        if follower is not None:
            state = follower.state
            body |= {
                "seeded_at": iso_time(state.seed_cutoff),
                "features_as_of": iso_time(state.newest),
                "customers": state.customers,
                "every_day_customers": state.every_day_customers,
                "state_bytes": state.nbytes(),
                "log_position": follower.seq,
                "log_lag_seconds": round(self.lag_seconds(), 3),
                "ingest_events_per_s": round(self._rate(self._accepted), 1),
                "applied_events_per_s": round(self._rate(self._applied), 1),
            }
        return body

    def _note(self, window: collections.deque[tuple[float, int]], events: int) -> None:
        now = self._clock()
        window.append((now, events))
        while window and window[0][0] < now - RATE_WINDOW_S:
            window.popleft()

    def _rate(self, window: collections.deque[tuple[float, int]]) -> float:
        now = self._clock()
        return sum(n for t, n in window if t >= now - RATE_WINDOW_S) / RATE_WINDOW_S


def _read_events(store: ObjectStore, key: str) -> pa.Table:
    """One file of a validated events dataset, in the segments' columns and types."""
    local = store.local_path(key)
    source = local if local is not None else io.BytesIO(store.get_bytes(key))
    table = pq.read_table(source)
    columns = []
    for f in SEGMENT_SCHEMA:
        if f.name in table.column_names:
            columns.append(table.column(f.name).cast(f.type))
        elif f.name == "quantity":
            columns.append(pa.array(np.ones(table.num_rows, dtype=np.int32)))
        else:
            default = "purchase" if f.name == "event_type" else None
            columns.append(pa.array([default] * table.num_rows, f.type))
    out = pa.Table.from_arrays(columns, schema=SEGMENT_SCHEMA)
    return out.filter(pc.is_valid(out.column("event_time")))


def iso_time(micros: int) -> str:
    """A time in microseconds since the epoch as ISO-8601 UTC text."""
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    return moment.isoformat().replace("+00:00", "Z")
