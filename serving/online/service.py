"""The endpoint's online features: the online state of the served snapshot, kept up with the
events log, and ingestion, which appends a batch to the log before it answers.

One :class:`Follower` (a state and how far into the log it is) serves at a time. When the
served snapshot changes, a new follower is seeded off to the side from the events that
snapshot was computed from (:class:`infra.storage.datasets.SourceEvents`), replays the log and is
swapped in; until then the old one keeps serving.

A follower's state is changed by the worker (:mod:`serving.online.worker`: a process of its
own in the server) and read here: its arrays are in blocks both map
(:mod:`serving.online.blocks`), read without waiting (:mod:`serving.online.header`'s seqlock;
a request waits only for the part of a segment that changes its customer, at most
:data:`serving.online.applier.PART_CUSTOMERS` customers). The seed is built here in a thread,
off to the side, and handed over to the worker (:mod:`serving.online.applier`) before it is
served. Ingestion (check against the state, append, apply) and tailing (catch up) take turns
through one lock, so the log's segments are applied once each, in order, whoever wrote them.
The worker also does the work that needs no state (parsing, the contract's checks, the
per-customer sums, encoding and decoding segments: :mod:`serving.online.prepare`); the store
is read and written here, in threads. A worker started again (the last one died) has no state:
the follower is dropped and the next poll seeds a new one (meanwhile requests are scored from
the snapshot).
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import functools
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
from infra.storage.events_log import SEGMENT_SCHEMA, EventsLog, SegmentInfo
from infra.storage.store import ObjectStore, PreconditionFailed
from serving.metrics import ServingMetrics
from serving.online import applier
from serving.online.applier import StateGone
from serving.online.events import DAY_US, event_arrays
from serving.online.ingest import refused
from serving.online.prepare import PreparedBatch, Refusal, decode_segment
from serving.online.state import OnlineState
from serving.online.worker import ThreadWorker, Worker
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
    segment id seen (id -> number, content sha256, rows). ``state`` is this process's reader
    of it; ``key`` names it in the worker that changes it (empty before it is handed over)."""

    state: OnlineState
    source: SourceEvents
    key: str = ""
    seq: int = 0
    segments: dict[str, tuple[int, str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class OnlineView:
    """What a request reads: the state, and the earliest day its features are computed at
    (today's under the wall clock; the state's newest event may be later)."""

    state: OnlineState
    at_least_day: int


class OnlineFeatures:
    """The online state of the served snapshot, the log it follows, ingestion into it. Its
    coroutines run on one event loop (the server's)."""

    def __init__(
        self,
        store: ObjectStore,
        settings: IngestSettings,
        metrics: ServingMetrics,
        clock: Callable[[], float] = time.time,
        worker: Worker | None = None,
        purchase_event: str | None = None,
    ) -> None:
        self.log = EventsLog(store)
        self._purchase_event = purchase_event  # HYBRIDFLOW_PURCHASE_EVENT, as validate reads it
        self._store = store
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._worker: Worker = worker or ThreadWorker()
        self._turn = asyncio.Lock()  # the one applier of the log: ingest, tail, swap
        self._seeding = threading.Lock()  # one seed at a time
        self.follower: Follower | None = None
        self._states: set[OnlineState] = set()  # every state made here and not released
        self.status = "on" if settings.online else "off: HYBRIDFLOW_SERVE__INGEST__ONLINE=false"
        self._refused_source: SourceEvents | None = None
        self._caught_up_at: float | None = None
        self._accepted: collections.deque[tuple[float, int]] = collections.deque()
        self._applied: collections.deque[tuple[float, int]] = collections.deque()
        metrics.online_lag.set_function(self.lag_seconds)

    async def start(self) -> None:
        """Start the worker (else its first call does)."""
        await self._worker.start()

    async def close(self) -> None:
        """Let every state go (their blocks unlinked) and stop the worker."""
        follower, self.follower = self.follower, None
        if follower is not None:
            await self._let_go(follower)
        for state in list(self._states):
            state.release()
        self._states.clear()
        await self._worker.close()

    async def _let_go(self, follower: Follower) -> None:
        """Release a follower's state here and in the worker (which may be gone)."""
        if follower.key:
            try:
                await self._worker.call(applier.release, follower.key)
            except Exception as exc:  # its blocks are unlinked from here below
                log.warning("the ingest worker did not release %s: %s", follower.key, exc)
        follower.state.release()
        self._states.discard(follower.state)

    def _lost(self, follower: Follower, exc: StateGone) -> None:
        """The worker lost the follower's state (it was started again): stop serving it; the
        next poll seeds another."""
        if self.follower is follower:
            self.follower = None
            self.status = f"off: {exc}; seeding it again"
            log.error("online state lost: %s", exc)
        follower.state.release()
        self._states.discard(follower.state)

    # following the snapshot and the log

    async def follow(self, snapshot: FeatureSnapshot | None) -> None:
        """Follow the served ``snapshot``: seed a new state when its events differ from the
        current state's, then apply the log's new segments."""
        if not self._settings.online:
            return
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
        if current is not None and (current.source == source or source == self._refused_source):
            async with self._turn:  # (a snapshot refused once: follow the log meanwhile)
                try:
                    await self._catch_up(current)
                except StateGone as exc:
                    self._lost(current, exc)
            return
        if source == self._refused_source:
            return
        self.status = "seeding" if current is None else self.status
        try:
            fresh = await asyncio.to_thread(self._seeded, source)
            try:
                fresh.key = await self._worker.call(applier.adopt, fresh.state.handover())
            except BaseException:
                fresh.state.release()
                self._states.discard(fresh.state)
                raise
        except Exception as exc:  # keep serving what there is; retried on a new snapshot
            self._refused_source = source
            reason = f"cannot seed from {source.events_data_prefix}: {exc}"
            self.status = f"off: {reason}" if current is None else f"stale: {reason}"
            self._metrics.reload_failures.labels("online", "seed_error").inc()
            log.error("online state not seeded: %s", reason)
            return
        async with self._turn:
            try:
                await self._catch_up(fresh)
            except StateGone as exc:
                self._lost(fresh, exc)
                return
            current, self.follower = self.follower, fresh
        if current is not None:
            await self._let_go(current)
        self._refused_source = None
        self.status = "on"
        log.info(
            "online state seeded at %s: %d customers, log position %d",
            iso_time(source.cutoff_micros),
            fresh.state.customers,
            fresh.seq,
        )

    def _seeded(self, source: SourceEvents) -> Follower:
        """A follower seeded with the source's events up to its cutoff and the log as it is
        (in a thread, off to the side: ingestion goes on meanwhile, the swap catches up the
        rest)."""
        started = time.perf_counter()
        with self._seeding:
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
            state = OnlineState(
                source.cutoff_micros,
                capacity=customers + customers // 8 + 1024,
                blocks=self._worker.blocks(),
            )
            self._states.add(state)
            state.seed(event_arrays(events))
            follower = Follower(state, source)
            while (data := self.log.read_bytes(follower.seq + 1)) is not None:
                seq = follower.seq + 1
                segment = decode_segment(seq, data, self.log.segment_uri(seq), state.seed_cutoff)
                state.apply_delta(segment.delta, state.group_rows(segment.delta))
                self._applied_segment(follower, segment.info, segment.delta.events)
        log.info(
            "seeded %d customers from %d events in %.1fs",
            state.customers,
            events.num_rows,
            time.perf_counter() - started,
        )
        return follower

    async def _catch_up(self, follower: Follower) -> None:
        """Have the worker apply the log's segments after the follower's position (the turn
        is held)."""
        while (data := await asyncio.to_thread(self.log.read_bytes, follower.seq + 1)) is not None:
            seq = follower.seq + 1
            info, events, applied = await self._worker.call(
                applier.apply_segment, follower.key, seq, data, self.log.segment_uri(seq)
            )
            follower.state.take(applied)
            self._applied_segment(follower, info, events)
        if follower is self.follower or self.follower is None:
            self._caught_up_at = self._clock()

    def _applied_segment(self, follower: Follower, info: SegmentInfo, applied: int) -> None:
        follower.seq = info.seq
        follower.segments[info.segment_id] = (info.seq, info.content_sha256, info.rows)
        self._note(self._applied, applied)
        self._metrics.events_applied.inc(applied)
        self._metrics.online_position.set(info.seq)
        self._metrics.online_customers.set(follower.state.customers)
        self._metrics.online_bytes.set(follower.state.nbytes())
        self._metrics.online_newest.set(follower.state.newest / 1e6)

    # ingestion

    async def ingest(self, body: bytes, content_type: str, idempotency_key: str | None) -> dict:
        """Check a batch, append it to the log as one segment and apply it; the answer.
        :class:`serving.online.ingest.IngestError` when anything is wrong (nothing applied)."""
        if idempotency_key is not None and not _IDEMPOTENCY_KEY.fullmatch(idempotency_key):
            raise refused("idempotency-key", "1 to 200 of A-Z a-z 0-9 . _ : -")
        prepared = await self._worker.call(
            applier.prepare_kept, body, content_type, idempotency_key, self._purchase_event
        )
        if isinstance(prepared, Refusal):
            self._metrics.events_ingested.labels("refused").inc(prepared.rows)
            raise prepared.error()
        # once the turn is taken the batch is checked, written and applied whole, even if the
        # request goes away meanwhile
        return await asyncio.shield(self._commit(prepared, body, content_type))

    async def _commit(self, prepared: PreparedBatch, body: bytes, content_type: str) -> dict:
        async with self._turn:
            follower = self.follower
            if follower is None:
                raise refused("online", f"no online state ({self.status})", status=503)
            try:
                return await self._committed(follower, prepared, body, content_type)
            except StateGone as exc:
                self._lost(follower, exc)
                raise refused("online", f"no online state ({self.status})", status=503) from exc

    async def _committed(
        self, follower: Follower, prepared: PreparedBatch, body: bytes, content_type: str
    ) -> dict:
        """Check the prepared batch against the follower's state, append it to the log and
        have the worker apply it (the turn is held); the answer."""
        for _ in range(APPEND_ATTEMPTS):
            await self._catch_up(follower)
            if prepared.segment_id in follower.segments:
                return self._repeated(follower, prepared.segment_id, prepared.sha)
            if await self._worker.call(
                applier.refuses, follower.key, prepared.ticket, self._latest()
            ):
                await self._refuse(follower, body, content_type, prepared)
            seq = follower.seq + 1
            try:
                info = await asyncio.to_thread(self.log.put, seq, prepared.segment)
            except PreconditionFailed:
                continue  # another replica took that number: read it, check again
            applied = await self._worker.call(applier.apply_kept, follower.key, prepared.ticket)
            follower.state.take(applied)
            self._applied_segment(follower, info, info.rows)
            self._note(self._accepted, info.rows)
            self._metrics.events_ingested.labels("accepted").inc(info.rows)
            return self._answer(follower, info.seq, prepared.segment_id, info.rows, False)
        raise refused("log", f"the log moved on {APPEND_ATTEMPTS} times in a row", status=503)

    def _latest(self) -> int:
        """The latest event time taken now (microseconds): the clock plus ``max_lead_s``."""
        return int((self._clock() + self._settings.max_lead_s) * 1e6)

    async def _refuse(
        self, follower: Follower, body: bytes, content_type: str, prepared: PreparedBatch
    ) -> None:
        """Raise the refusal naming the rows the online state refuses (the rare batch: the
        worker reads its body again)."""
        refusal: Refusal = await self._worker.call(
            applier.refusal,
            follower.key,
            body,
            content_type,
            self._latest(),
            self._purchase_event,
            prepared.ticket,
        )
        self._metrics.events_ingested.labels("refused").inc(refusal.rows)
        raise refusal.error()

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


@functools.lru_cache(maxsize=256)
def iso_time(micros: int) -> str:
    """A time in microseconds since the epoch as ISO-8601 UTC text (the last few remembered:
    every request answers its ``features_as_of``, which moves only when events are applied)."""
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    return moment.isoformat().replace("+00:00", "Z")
