"""The run's cutoffs: every training label window ends at or before T, every backtest one at or
before T-H; origins at the same instant are one cutoff; origins before the first event are left
out (the newest never is)."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.data.cutoffs import Origins, end_of_day, pipeline_cutoffs

AS_OF = dt.date(2025, 6, 30)


@settings(deadline=None)  # a loaded box must not fail a pure function on time
@given(
    horizon=st.integers(1, 400),
    count=st.integers(1, 12),
    stride=st.one_of(st.none(), st.integers(1, 400)),
)
def test_label_windows_end_by_t_and_the_backtests_by_t_minus_h(horizon, count, stride):
    run = pipeline_cutoffs(AS_OF, horizon, Origins(count, stride))
    t, h = end_of_day(AS_OF), dt.timedelta(days=horizon)
    assert len(run.train) == len(run.backtest) == count
    assert run.train[0].at == t - h and run.backtest[0].at == t - 2 * h
    assert run.score.at == t and run.score.label_until is None
    for origins, last in ((run.train, t), (run.backtest, t - h)):
        assert all(c.label_until == c.at + h and c.label_until <= last for c in origins)
        assert [c.at for c in origins] == sorted((c.at for c in origins), reverse=True)
        gaps = {a.at - b.at for a, b in zip(origins, origins[1:], strict=False)}
        assert gaps <= {dt.timedelta(days=stride or horizon)}
    names = [c.name for c in run.distinct()]
    assert len(names) == len(set(names)) == len({c.at for c in run.distinct()})


def test_a_stride_dividing_the_horizon_shares_origins_with_the_backtest():
    run = pipeline_cutoffs(AS_OF, 90, Origins(count=4))
    assert run.backtest[:3] == run.train[1:]  # same instant, same label window: one cutoff
    assert len(run.distinct()) == 4 + 1 + 1
    assert [c.name for c in run.train] == ["d90", "d180", "d270", "d360"]


def test_origins_before_the_first_event_are_left_out_but_the_newest_is_kept():
    first = AS_OF - dt.timedelta(days=200)
    run = pipeline_cutoffs(AS_OF, 90, Origins(count=4), first_event=first)
    assert [c.name for c in run.train] == ["d90", "d180"]
    assert [c.name for c in run.backtest] == ["d180"]
    short = pipeline_cutoffs(AS_OF, 90, Origins(count=4), first_event=AS_OF)
    assert [c.name for c in short.backtest] == ["d180"]  # the stage says why it is unusable


@pytest.mark.parametrize("count, stride", [(0, None), (2, 0)])
def test_bad_origins_are_refused(count, stride):
    with pytest.raises(ValueError, match="origins need"):
        Origins(count, stride)
