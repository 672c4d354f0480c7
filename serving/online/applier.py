"""The changes to the endpoint's online states, made where its worker runs
(:mod:`serving.online.worker`: a process of its own in the server), so that applying events
costs the request-serving process nothing: it reads the same states' blocks
(:mod:`serving.online.blocks`) optimistically (:mod:`serving.online.header`).

The endpoint hands a state seeded off to the side over (:func:`adopt`; :func:`release` when it
is no longer served) and names it by its key in every call. The calls of one state come in log
order (the endpoint calls under its one turn of the log), so the segments are applied once each
and in order, as in one process. A batch prepared for ``POST /events`` keeps its per-customer
sums here (:func:`prepare_kept`) until it is applied (:func:`apply_kept`) or refused: they do
not cross to the endpoint and back.

A worker started again (the last one died) has none of the states: each call for one raises
:class:`StateGone`, and the endpoint seeds a new one.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools

from infra.storage.events_log import SegmentInfo
from serving.online.delta import Delta
from serving.online.events import Coded
from serving.online.prepare import (
    PreparedBatch,
    Refusal,
    decode_segment,
    online_refusal,
    prepare_batch,
)
from serving.online.state import Applied, Handover, OnlineState

PART_CUSTOMERS = 1_024  # customers changed at once: a read of one of them waits that long at most
KEPT_BATCHES = 64  # prepared batches whose sums wait here for their turn (the oldest dropped)

_STATES: dict[str, OnlineState] = {}
_KEPT: collections.OrderedDict[int, Delta] = collections.OrderedDict()
_TICKETS = itertools.count()


class StateGone(RuntimeError):
    """The worker has no state of that key (it was started again since the state was handed
    over, the state was released, or an apply failed half-way and the state was dropped)."""


def _state(key: str) -> OnlineState:
    try:
        return _STATES[key]
    except KeyError:
        raise StateGone(f"the ingest worker holds no online state {key}") from None


def adopt(handover: Handover) -> str:
    """Take the state :meth:`OnlineState.handover` gave; its key."""
    state = OnlineState.adopt(handover)
    _STATES[handover.header] = state
    return handover.header


def release(key: str) -> None:
    """Let the state go and unlink its blocks (none of that key: nothing to do)."""
    state = _STATES.pop(key, None)
    if state is not None:
        state.release()


def held() -> list[str]:
    """The keys of the states held."""
    return list(_STATES)


def apply_segment(key: str, seq: int, data: bytes, where: str) -> tuple[SegmentInfo, int, Applied]:
    """Apply segment ``seq`` of the log (its file's bytes, ``where``: its address) to the
    state: its info, the events applied, what the state's readers need to know."""
    state = _state(key)
    segment = decode_segment(seq, data, where, state.seed_cutoff)
    return segment.info, segment.delta.events, _apply(key, state, segment.delta)


def prepare_kept(
    body: bytes, content_type: str, idempotency_key: str | None, purchase_event: str | None
) -> PreparedBatch | Refusal:
    """:func:`serving.online.prepare.prepare_batch`, its sums kept here (the answer carries
    none) for :func:`refuses` and :func:`apply_kept`."""
    prepared = prepare_batch(body, content_type, idempotency_key, purchase_event)
    if isinstance(prepared, Refusal):
        return prepared
    assert prepared.delta is not None
    ticket = next(_TICKETS)
    _KEPT[ticket] = prepared.delta
    while len(_KEPT) > KEPT_BATCHES:
        _KEPT.popitem(last=False)
    return dataclasses.replace(prepared, delta=None, ticket=ticket)


def _kept(ticket: int) -> Delta:
    try:
        return _KEPT[ticket]
    except KeyError:
        raise StateGone(f"the ingest worker no longer holds prepared batch {ticket}") from None


def refuses(key: str, ticket: int, latest: int) -> bool:
    """Whether the state refuses an event of the kept batch: one at or before its seed's
    cutoff, one later than ``latest`` (microseconds), or a purchase before its customer's
    last one."""
    state = _state(key)
    delta = _kept(ticket)
    return (
        int(delta.first_t.min()) <= state.seed_cutoff
        or delta.newest > latest
        or bool(
            state.purchases_before_last(delta, _rows_by_code(state, delta)[delta.group_code]).any()
        )
    )


def _rows_by_code(state: OnlineState, delta: Delta) -> object:
    """The row of each of ``delta``'s customers (by code), -1 for one the state has not seen."""
    return state.code_rows(Coded(delta.group_code, delta.customers, every_value_used=True))


def refusal(
    key: str,
    body: bytes,
    content_type: str,
    latest: int,
    purchase_event: str | None,
    ticket: int,
) -> Refusal:
    """The refusal naming the rows of a batch the state refuses (:func:`refuses`); the kept
    sums are dropped."""
    state = _state(key)
    delta = _KEPT.pop(ticket, None)
    last = (
        {} if delta is None else state.last_purchases(delta.customers, _rows_by_code(state, delta))
    )
    return online_refusal(body, content_type, state.seed_cutoff, latest, last, purchase_event)


def apply_kept(key: str, ticket: int) -> Applied:
    """Apply the kept batch (written to the log as the next segment) to the state."""
    state = _state(key)
    delta = _kept(ticket)
    del _KEPT[ticket]
    return _apply(key, state, delta)


def _apply(key: str, state: OnlineState, delta: Delta) -> Applied:
    """Apply ``delta``; a state whose apply failed part-way (no room for a grown block, say)
    is dropped, not kept half-changed: :class:`StateGone`, and the endpoint seeds another."""
    before = state.customers
    try:
        state.apply_delta(delta, state.group_rows(delta), PART_CUSTOMERS)
    except Exception as exc:
        release(key)
        raise StateGone(f"online state {key} dropped: an apply failed ({exc})") from exc
    return state.applied(before)
