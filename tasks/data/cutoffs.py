"""The points in time features are computed at, and the pipeline's three of them.

Features at cutoff ``c`` use only events with ``event_time <= c``. The pipeline trains on
features at ``T - H`` with the label "purchased in (T - H, T]" and scores features at ``T``; the
out-of-time backtest trains the same way one horizon earlier: features at ``T - 2H``, labels in
``(T - 2H, T - H]``. Times are naive UTC; aware ones are converted.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import NamedTuple

EPOCH = dt.datetime(1970, 1, 1)
TRAIN_CUTOFF = "train"
SCORE_CUTOFF = "score"
BACKTEST_CUTOFF = "backtest"


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


class PipelineCutoffs(NamedTuple):
    """The cutoffs of a run (see :func:`pipeline_cutoffs`)."""

    train: Cutoff
    score: Cutoff
    backtest: Cutoff


def pipeline_cutoffs(as_of: dt.date, horizon_days: int) -> PipelineCutoffs:
    """The pipeline's cutoffs for T = the end of ``as_of`` and H: training features at T-H
    labelled with "purchased in (T-H, T]", scoring features at T, and the backtest's training
    features at T-2H labelled with "purchased in (T-2H, T-H]"."""
    at = end_of_day(as_of)
    horizon = dt.timedelta(days=horizon_days)
    return PipelineCutoffs(
        train=Cutoff(TRAIN_CUTOFF, at - horizon, label_until=at),
        score=Cutoff(SCORE_CUTOFF, at),
        backtest=Cutoff(BACKTEST_CUTOFF, at - 2 * horizon, label_until=at - horizon),
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
