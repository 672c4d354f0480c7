"""Time semantics of a run, on the events' span (first and last valid event): which T a run takes
(``as_of``, checked against the events), what the label window (T-H, T] holds when T is after
the last event, whether the backtest's history is long enough, whether events after T can
exist, the event times validation accepts, and the two label classes training needs. Plain
Python over a validate result's figures (any object with ``first_event``/``last_event``)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Protocol

from infra.errors import HybridflowInputError
from infra.settings import HybridflowSettings, settings_defaults
from tasks.data.cutoffs import Cutoff, end_of_day
from tasks.data.event_types import event_types_text
from tasks.data.validation_sql import RowBounds

log = logging.getLogger(__name__)


class EventSpan(Protocol):
    """The span of a run's valid events (a ``ValidateResult``)."""

    @property
    def first_event(self) -> dt.datetime | None: ...

    @property
    def last_event(self) -> dt.datetime | None: ...


def event_time_bounds(settings: HybridflowSettings, now: dt.datetime | None = None) -> RowBounds:
    """The values a run validated ``now`` (default: this machine's clock) accepts: event times
    from the ``event_time_floor`` setting to ``event_time_max_lead_hours`` after ``now``,
    amounts up to ``max_amount``."""
    return RowBounds.around(
        now or dt.datetime.now(dt.UTC),
        dt.timedelta(hours=settings.event_time_max_lead_hours),
        settings.event_time_floor,
        settings.max_amount,
    )


def resolve_as_of(
    validated: EventSpan,
    as_of: dt.date | None,
    horizon_days: int,
    after_events: bool = False,
    grace_days: int | None = None,
) -> dt.date:
    """T (default: the last valid event's date), checked against the span of the events: a T
    more than ``grace_days`` (the flow passes the ``as_of_grace_days`` setting; default: its
    declared default) after the last event's day needs ``after_events`` (its label window is
    cut short)."""
    if validated.first_event is None or validated.last_event is None:
        raise HybridflowInputError("no valid events to compute features from")
    as_of = as_of or validated.last_event.date()
    note = label_window_note(validated, as_of, horizon_days)
    if grace_days is None:
        grace_days = settings_defaults().as_of_grace_days
    grace = dt.timedelta(days=grace_days)
    if note is not None and as_of > validated.last_event.date() + grace and not after_events:
        raise HybridflowInputError(f"{note}; pass --as-of-after-events to train on it anyway")
    first_day = validated.first_event.date()
    if as_of < first_day:
        raise HybridflowInputError(
            f"as_of {as_of} is before the first event ({first_day}): nothing to learn from"
        )
    training_cutoff = end_of_day(as_of) - dt.timedelta(days=horizon_days)
    if training_cutoff.date() < first_day:
        raise HybridflowInputError(
            f"as_of {as_of} minus horizon {horizon_days} days is before the first event "
            f"({first_day}): no customer has an event in the training window"
        )
    return as_of


def label_window_note(validated: EventSpan, as_of: dt.date, horizon_days: int) -> str | None:
    """What the label window (T-H, T] holds when T is after the last valid event's day (None
    otherwise): the days of it that have events, out of the horizon."""
    last = validated.last_event
    if last is None or as_of <= last.date():
        return None
    start = as_of - dt.timedelta(days=horizon_days)
    covered = max((last.date() - start).days, 0)
    return (
        f"as_of {as_of} is {(as_of - last.date()).days} day(s) after the last event "
        f"({last.date()}): the label window ({start}, {as_of}] holds events on {covered} of "
        f"its {horizon_days} days, so buyers after {last.date()} are labelled as non-buyers"
    )


def history_too_short(validated: EventSpan, backtest: Cutoff) -> str | None:
    """Why there is no backtest when its cutoff T-2H is before the first event (else None)."""
    first = validated.first_event
    if first is not None and backtest.at.date() >= first.date():
        return None
    reason = (
        f"history too short for the backtest: it would train at as_of - 2 x horizon = "
        f"{backtest.at.date()}, before the first event ({first.date() if first else '-'})"
    )
    log.warning("%s", reason)
    return reason


def events_after_possible(validated: EventSpan, score: Cutoff) -> bool:
    """Whether the last valid event is after T (else there is nothing to count)."""
    last = validated.last_event
    return last is not None and last.astimezone(dt.UTC).replace(tzinfo=None) > score.at


def check_labels(
    positive_rate: float,
    n: int,
    as_of: dt.date,
    horizon_days: int,
    event_types: Callable[[], dict[str, int]] | None = None,
) -> None:
    """Training needs both classes: a single class in the labels is an input error. With no
    buyer, ``event_types`` (the log's rows per event type, asked only then) tells a log without
    any purchase, whose error names the types it has and ``--purchase-event``."""
    if positive_rate == 0.0 and event_types is not None:
        counts = event_types()
        if "purchase" not in counts:
            raise HybridflowInputError(
                f"no event is a purchase: the events' event_type values are "
                f"{event_types_text(counts)}, and none is purchase or a synonym (transaction, "
                "order, sale, buy): name the value that is the purchase with --purchase-event "
                "VALUE (a deployment run: params.input.purchase_event; or the setting "
                "HYBRIDFLOW_PURCHASE_EVENT)"
            )
    if positive_rate in (0.0, 1.0):
        none_bought = (
            "; a label counts events whose event_type is purchase (or a synonym such as "
            "transaction or order, or the value --purchase-event names: docs/data-contract.md)"
            if positive_rate == 0.0
            else ""
        )
        raise HybridflowInputError(
            f"all {n} training labels are {int(positive_rate)} for as_of {as_of} and "
            f"horizon {horizon_days} days: the model needs both "
            f"buyers and non-buyers (try another --as-of or --horizon-days){none_bought}"
        )
