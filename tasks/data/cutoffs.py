"""The points in time features are computed at, and the pipeline's cutoffs.

Features at cutoff ``c`` use only events with ``event_time <= c``. With T = as_of and H = horizon,
the pipeline scores features at T and trains on examples from several *origins*: features at
``T - H - k s`` labelled "purchased in (T - H - k s, T - k s]" for ``k = 0 .. K-1`` (``K`` origins,
stride ``s`` days), so every label window ends at or before T. The out-of-time backtest trains the
same way one horizon earlier (origins ``T - 2H - k s``, label windows ending at or before T - H)
and is judged on the examples at T - H. Cutoffs at the same instant are the same cutoff (same
features, same label window), computed once. Times are naive UTC; aware ones are converted.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

EPOCH = dt.datetime(1970, 1, 1)
SCORE_CUTOFF = "score"


@dataclass(frozen=True)
class Cutoff:
    """A point in time to compute features at (events ``<= at``); with ``label_until`` also the
    label "purchased in ``(at, label_until]``". ``name`` prefixes its columns in a wide table."""

    name: str
    at: dt.datetime
    label_until: dt.datetime | None = None

    def micros(self) -> int:
        """``at`` as microseconds since the epoch (naive = UTC)."""
        return micros(self.at)

    def origin(self) -> dt.date:
        """The day of ``at``: how an example records the cutoff it was taken at."""
        return self.at.date()


@dataclass(frozen=True)
class Origins:
    """How many training origins a run takes (``count``, the newest at T - H) and the days
    between consecutive ones (``stride_days``; None: the horizon, so label windows tile)."""

    count: int = 1
    stride_days: int | None = None

    def __post_init__(self) -> None:
        if self.count < 1 or (self.stride_days is not None and self.stride_days < 1):
            raise ValueError(f"origins need count >= 1 and stride_days >= 1, got {self}")

    def stride(self, horizon_days: int) -> dt.timedelta:
        """The stride as a time span."""
        return dt.timedelta(days=self.stride_days or horizon_days)


@dataclass(frozen=True)
class PipelineCutoffs:
    """The cutoffs of a run (see :func:`pipeline_cutoffs`): the training origins and the
    backtest's, newest first, and the scoring cutoff."""

    train: tuple[Cutoff, ...]
    score: Cutoff
    backtest: tuple[Cutoff, ...]

    def distinct(self) -> list[Cutoff]:
        """Every cutoff once (an origin shared by the training and the backtest is one)."""
        seen: dict[str, Cutoff] = {}
        for cutoff in (*self.train, self.score, *self.backtest):
            seen.setdefault(cutoff.name, cutoff)
        return list(seen.values())

    def __iter__(self):
        return iter(self.distinct())


def labelled_cutoff(as_of_end: dt.datetime, at: dt.datetime, horizon: dt.timedelta) -> Cutoff:
    """The cutoff at ``at`` labelled over ``(at, at + horizon]``, named by its whole days
    before ``as_of_end`` (``d<days>``), so equal instants share one name."""
    days = (as_of_end - at) // dt.timedelta(days=1)
    return Cutoff(f"d{days}", at, label_until=at + horizon)


def pipeline_cutoffs(
    as_of: dt.date,
    horizon_days: int,
    origins: Origins | None = None,
    first_event: dt.date | None = None,
) -> PipelineCutoffs:
    """The run's cutoffs for T = the end of ``as_of`` and H: the scoring cutoff at T, the training
    origins at ``T - H - k s`` and the backtest's at ``T - 2H - k s`` (``k < origins.count``).
    Older origins before ``first_event``'s day (no customer seen yet) are left out; the newest
    of each is always kept (the features stage says why it cannot be used)."""
    origins = origins or Origins()
    at = end_of_day(as_of)
    horizon = dt.timedelta(days=horizon_days)
    stride = origins.stride(horizon_days)

    def series(newest: dt.datetime) -> tuple[Cutoff, ...]:
        cutoffs = [labelled_cutoff(at, newest - k * stride, horizon) for k in range(origins.count)]
        return tuple(
            c
            for k, c in enumerate(cutoffs)
            if k == 0 or first_event is None or c.at.date() >= first_event
        )

    return PipelineCutoffs(
        train=series(at - horizon),
        score=Cutoff(SCORE_CUTOFF, at),
        backtest=series(at - 2 * horizon),
    )


def end_of_day(day: dt.date) -> dt.datetime:
    """The as-of instant for a date: the last microsecond of that UTC day (naive)."""
    return dt.datetime.combine(day, dt.time.max)


def micros(value: dt.datetime) -> int:
    """``value`` as microseconds since the epoch."""
    return (as_naive_utc(value) - EPOCH) // dt.timedelta(microseconds=1)


def as_naive_utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC without a time zone (naive values are taken as UTC already)."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value
