"""The work on a batch of events, or on a segment of the log, that needs no online state: what
the endpoint hands to its worker process (:mod:`serving.online.worker`) so that the CPU it costs
never holds the request-serving process's interpreter.

- :func:`prepare_batch`: a ``POST /events`` body parsed and checked by the contract's rules,
  put in time order, summed per customer (:func:`serving.online.delta.delta_of`) and encoded as a
  segment's Parquet file; or the refusal naming its bad rows.
- :func:`decode_segment`: a segment's file read back and summed per customer (a replica
  following the log, or an endpoint catching up).
- :func:`online_refusal`: the answer naming the rows the online state refused
  (:data:`serving.online.ingest.ONLINE_REASONS`), for the rare batch it refuses.

Every result is plain data (arrays, lists, bytes) that pickles, so it crosses a pipe.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from infra.storage.events_log import EncodedSegment, SegmentInfo, encode_segment
from infra.storage.events_log import decode_segment as read_segment
from serving.online.delta import Delta, delta_of
from serving.online.events import NO_TIME, EventArrays, event_arrays
from serving.online.ingest import (
    REASON_BEFORE_SNAPSHOT,
    REASON_IN_THE_FUTURE,
    REASON_PURCHASE_OUT_OF_ORDER,
    IngestError,
    check_contract,
    parse_events,
)


@dataclass(frozen=True)
class Refusal:
    """A batch refused whole: what :class:`serving.online.ingest.IngestError` carries (it does
    not pickle), and the rows it had."""

    status: int
    problems: list[dict[str, str]]
    rows: int
    extra: dict[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, error: IngestError, rows: int) -> Refusal:
        return cls(error.status, error.problems, rows, dict(error.extra))

    def error(self) -> IngestError:
        return IngestError(self.status, self.problems, **self.extra)


@dataclass(frozen=True)
class PreparedBatch:
    """A batch every contract rule accepts, ready to be checked against the online state,
    written and applied."""

    segment_id: str
    sha: str
    segment: EncodedSegment  # its events in time order
    # their per-customer sums (all the online checks need, and the apply); None in the
    # answer of serving.online.applier.prepare_kept, which keeps them in the worker
    delta: Delta | None
    ticket: int = -1  # serving.online.applier's number for the sums it keeps


@dataclass(frozen=True)
class DecodedSegment:
    """A segment of the log read back: its info, and its events after ``after_us`` (the
    state's seed cutoff) with their per-customer sums."""

    info: SegmentInfo
    arrays: EventArrays
    delta: Delta


def segment_id_of(sha: str, idempotency_key: str | None) -> str:
    """A batch's segment id: the ``Idempotency-Key`` it came with, else its body's sha256."""
    return idempotency_key or f"sha256:{sha}"


def prepare_batch(
    body: bytes, content_type: str, idempotency_key: str | None, purchase_event: str | None = None
) -> PreparedBatch | Refusal:
    """``body`` parsed, checked (``purchase_event``: the log's own name for a purchase),
    ordered, summed and encoded; or its refusal."""
    try:
        checked = check_contract(parse_events(body, content_type), purchase_event)
    except IngestError as exc:  # a malformed body: no rows to count
        return Refusal.of(exc, 0)
    if (problem := checked.problem()) is not None:
        return Refusal.of(problem, checked.rows)
    sha = hashlib.sha256(body).hexdigest()
    segment_id = segment_id_of(sha, idempotency_key)
    events, arrays = checked.events, event_arrays(checked.events)
    if not (np.diff(arrays.t) >= 0).all():  # a segment is in time order; sent so, often
        order = np.argsort(arrays.t, kind="stable")
        events = events.take(pa.array(order))
        arrays = arrays.take(order, permutation=True)
    segment = encode_segment(events, segment_id, sha)
    return PreparedBatch(segment_id, sha, segment, delta_of(arrays))


def decode_segment(seq: int, data: bytes, where: str, after_us: int) -> DecodedSegment:
    """Segment ``seq`` from its file's bytes (``where``: its address), its events after
    ``after_us`` (earlier ones are the served snapshot's) summed per customer."""
    segment = read_segment(seq, data, where)
    arrays = event_arrays(segment.events)
    after = arrays.t > after_us
    if not after.all():
        arrays = arrays.take(after)
    return DecodedSegment(segment.info, arrays, delta_of(arrays))


def online_refusal(
    body: bytes,
    content_type: str,
    seed_cutoff: int,
    latest: int,
    last_purchase: dict[str, int],
    purchase_event: str | None = None,
) -> Refusal:
    """The refusal of a batch the contract accepted and the online state did not, naming its
    rows: at or before the state's ``seed_cutoff``, after ``latest`` (microseconds), or a
    purchase before its customer's last one in the state (``last_purchase``: of the batch's
    customers that have one); a row gets the first of these reasons that holds for it."""
    checked = check_contract(parse_events(body, content_type), purchase_event)
    arrays = event_arrays(checked.events)
    customers = arrays.customer
    last = np.fromiter(
        (last_purchase.get(c, NO_TIME) for c in customers.values), np.int64, len(customers.values)
    )
    reasons = [
        (REASON_BEFORE_SNAPSHOT, arrays.t <= seed_cutoff),
        (REASON_IN_THE_FUTURE, arrays.t > latest),
        (REASON_PURCHASE_OUT_OF_ORDER, arrays.purchase & (arrays.t < last[customers.codes])),
    ]
    for reason, mask in reasons:
        checked = checked.refuse_where(mask, reason)
    problem = checked.problem()
    if problem is None:
        raise ValueError("online_refusal: no row is refused")
    return Refusal.of(problem, checked.rows)
